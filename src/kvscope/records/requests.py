"""The request stream (requests.jsonl -> requests.parquet): one row per LLM invocation, failed
ones included.

Columns follow the design note's "Canonical request schema"; a value that was not measured is
None (null in Parquet), never 0: the columns filled after the call (server timings and context,
prompt instrumentation, provenance) default to None. `sglang_response_id` keeps the design note's
name: it is the engine's response id (on SGLang it equals the rid kvscope sent).
"""

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvscope.records.base import arrow_schema, conform, read_jsonl
from kvscope.records.prompt_columns import with_prompt_columns

REQUESTS_JSONL = "requests.jsonl"  # appended and flushed as each call ends
REQUESTS_PARQUET = "requests.parquet"  # the same rows, typed, with the columns finalize fills

STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    # experiment
    benchmark_run_id: str
    experiment_name: str
    configuration_hash: str
    timestamp: str  # ISO 8601 UTC of request submission
    # workflow
    thread_id: str | None  # None: the app's invocation had no thread_id
    workflow_run_id: str | None  # one graph invocation; None outside any graph
    workflow_type: str
    workflow_concurrency: int | None  # None: an app's own concurrency (not kvscope's)
    turn_id: int | None  # the agent's visit in its workflow run, from 1 (probe/identity.py)
    thread_turn: int | None = None  # the invocation's ordinal among its thread's, from 1
    # agent
    agent_id: str | None  # None: a call no agent could be named for (still a row)
    previous_agent_id: str | None
    graph_node: str | None  # the node's full path from the root graph: `outer/inner`
    request_uuid: str
    # request
    model_name: str
    sglang_response_id: str | None
    # the replica that served the call behind a router (config deployment: r0, r1, ...); None
    # with one engine (no deployment) and where the serving replica could not be told
    replica: str | None = None
    prompt_tokens: int | None
    output_tokens: int | None  # generated tokens, a reasoning model's reasoning included
    reasoning_tokens: int | None = None  # of output_tokens, where the engine reports them
    # cache
    cached_tokens: int | None
    new_prefill_tokens: int | None
    reported_cache_hit_ratio: float | None
    # timing (ms)
    queue_ms: float | None = None
    ttft_ms: float | None
    tpot_ms: float | None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    e2e_ms: float | None
    tool_ms: float | None  # the agent's tool time before this call (Executor), else None
    # server state (Level 2): context from the nearest /metrics samples, not ownership
    cache_used_tokens_before: int | None = None
    cache_used_tokens_after: int | None = None
    cache_utilization_before: float | None = None
    cache_utilization_after: float | None = None
    running_requests: int | None = None  # before the request
    queued_requests: int | None = None  # before the request
    # prompt
    prompt_template_version: str | None
    chat_template_name: str | None
    prompt_hash: str | None = None
    token_id_hash: str | None = None
    prompt_layout: str | None
    sharing_mode: str | None  # RQ5: what the agents' prompts share (tasks mode)
    raw_messages_json: str | None = None  # opt-in (workload.store_prompts)
    serialized_prompt_text: str | None = None  # opt-in: the chat template's output
    fixed_prefix_tokens: int | None = None  # tokens up to the end of the fixed (system) messages
    dynamic_suffix_tokens: int | None = None
    first_divergence_same_agent: int | None = None  # vs this agent's previous call in the workflow
    first_divergence_previous_agent: int | None = None  # vs the workflow's previous call
    max_reusable_tokens: int | None = None  # longest common prefix with any earlier call of the run
    # Where prompt_hash / token_id_hash / fixed_prefix_tokens came from: "engine" (the engine
    # returned the prompt's token ids) or "tokenizer" (the model's tokenizer and chat template);
    # None: no token ids. A count that differs from prompt_tokens is flagged, never used.
    prompt_token_source: str | None = None
    prompt_token_count: int | None = None  # how many ids kvscope has for the prompt
    prompt_token_mismatch: bool | None = None  # prompt_token_count != prompt_tokens
    # the app's own MLflow trace this call's span is in (e.g. mlflow.langchain.autolog());
    # None: kvscope writes the invocation's trace itself
    mlflow_trace_id: str | None = None
    # Filled after the call (finalize): provenance (Level 3, from KV events), cached tokens by who
    # stored them, uncached by cause
    cached_self_tokens: int | None = None  # stored by the same agent of the same workflow
    cached_cross_agent_tokens: int | None = None  # another agent, same workflow
    cached_cross_workflow_tokens: int | None = None  # another workflow
    cached_unattributed_tokens: int | None = None  # hit, but no store event seen for the block
    uncached_evicted_tokens: int | None = None  # stored with this exact prefix, then evicted
    uncached_layout_tokens: int | None = None  # content seen earlier, but behind another prefix
    uncached_cold_tokens: int | None = None  # never seen before (tail of a partial block included)
    # Behind a router (finalize.routing_misses): of the uncached tokens, those cached on another
    # replica at that moment, and that replica; None with one engine or where it cannot be told
    routing_miss_tokens: int | None = None
    routing_miss_replica: str | None = None
    # the engine priority the call carried (an eviction hint, probe/hints.py, or the app's own);
    # None: it carried none
    engine_priority: int | None = None
    # result
    status: str
    error_type: str | None = None
    error_message: str | None = None
    finish_reason: str | None
    # raw clocks (ns since epoch) for joins with server-side series
    start_ns: int
    end_ns: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def conform(cls, table: pa.Table) -> pa.Table:
        """The table with every column: ones an older run lacks are added as nulls."""
        return conform(table, ARROW_SCHEMA)


def derived_cache(
    prompt_tokens: int | None, cached_tokens: int | None
) -> tuple[int | None, float | None]:
    """(new_prefill_tokens, reported_cache_hit_ratio) as the design note defines them."""
    if prompt_tokens is None or cached_tokens is None:
        return None, None
    new_prefill = max(prompt_tokens - cached_tokens, 0)
    ratio = cached_tokens / prompt_tokens if prompt_tokens else None
    return new_prefill, ratio


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
# Level 3: where a call's cached tokens came from and why the rest was computed (finalize fills
# them from the KV events; they sum to cached_tokens and to prompt - cached tokens).
PROVENANCE_COLUMNS: tuple[str, ...] = tuple(
    c for c in COLUMNS if c.startswith(("cached_", "uncached_")) and c != "cached_tokens"
)
ARROW_SCHEMA = arrow_schema(RequestRecord)


def to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts with the record's keys; a missing one is null) as the typed table."""
    columns = {name: [row.get(name) for row in rows] for name in COLUMNS}
    return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)


def read_rows(run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSONL stream's rows and how many torn lines were skipped."""
    return read_jsonl(run_dir / REQUESTS_JSONL)


def write_table(run_dir: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    target = run_dir / REQUESTS_PARQUET
    pq.write_table(to_table(rows), target)
    return target


def load_table(run_dir: Path) -> pa.Table:
    """The run's request table, all columns: Parquet when written, else straight from the JSONL."""
    parquet = run_dir / REQUESTS_PARQUET
    if parquet.exists():
        return RequestRecord.conform(pq.read_table(parquet))
    return with_prompt_columns(to_table(read_rows(run_dir)[0]), run_dir)


def exists(run_dir: Path) -> bool:
    """Whether the directory holds a request table (of either form): a kvscope run directory."""
    return (run_dir / REQUESTS_PARQUET).exists() or (run_dir / REQUESTS_JSONL).exists()
