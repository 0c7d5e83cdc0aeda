"""Where a replay's trace comes from: a kvscope run directory, a Mooncake trace, a token-id trace.

`load_source(path, block_size)` reads any of the three into a `Source` (a `Trace` plus what the
replay needs to say about it):

- a run directory: every successful call with its exact prompt token ids (prompt_tokens.arrow,
  hashed into block keys a chunk at a time as it is read: run_keys.py; the ids are not kept),
  started when the engine scheduled it (schedule.py) and ended at end_ns, with its agent,
  workflow and previous agent, and the engine priority it carried (eviction hints; a run
  whose calls carried none: no priorities); the run's block size, KV capacity, engine (an
  attached one's detected family) and eviction policy (run.json); the engine's measured cached
  tokens (null stays NaN); when its prompt became matchable (prefill_end_s: its first token,
  sent + TTFT, which the engine streams right after inserting the prompt into its tree; the
  start without a TTFT). Calls that failed or have no token ids are left out and counted in
  `excluded`.
- a Mooncake trace (JSONL): `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one
  id per block of `block_size` tokens; equal ids = equal block and prefix). Only the ids of
  full blocks become keys (a partial last block is never cached).
- a token-id trace (JSONL): `request_id`, `token_ids`, optional `timestamp` (ms; absent: the
  line's position), `agent`, `workflow`, `output_length` (absent: 0, and said so); or the same
  columns as Arrow (an IPC stream such as kvscope's prompt_tokens.arrow, or an IPC file) or
  Parquet, read without parsing text (sim/inputs/arrow_tokens.py).

A JSONL trace may be gzip-, bzip2- or xz-compressed (told by its first bytes, whatever its name)
and may begin with a UTF-8 byte order mark. Both JSONL formats also accept kvscope's extensions
`end_timestamp` (ms: when the request ended; absent: at its start), `previous_agent` (absent:
the agent of the workflow's previous request) and, on Mooncake lines, `request_id`, `agent`,
`workflow`.
A bad line is a KvscopeError naming the file, the line number and the field (what is refused:
sim/inputs/jsonl.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvscope.errors import KvscopeError
from kvscope.records import formats
from kvscope.sim.inputs import chunks, jsonl
from kvscope.sim.inputs.rows import Read, gathered
from kvscope.sim.trace import Trace

if TYPE_CHECKING:  # a run directory's readers load with one (pyarrow, finalize): not for a trace
    from kvscope.records.run_dir import RunDir
    from kvscope.sim.inputs.run_keys import PromptKeys

KINDS = ("run", "mooncake", "tokens")


@dataclass(frozen=True)
class Source:
    """A loaded trace and the facts about its source that the replay reports.

    `policy`: the engine's own eviction policy (run directories only, else None).
    `excluded`: reason -> number of calls left out of the trace (run directories).
    `id_mismatch[i]`: request i's token ids do not count its prompt_tokens (None: not known).
    `excluded_start_s`: when each left-out call began (seconds, the trace's clock; calls without
    a clock are not in it): their blocks were in the engine's cache but are not replayed.
    `notes`: one-line facts to print with the replay.
    """

    kind: str  # one of KINDS
    trace: Trace
    run: RunDir | None = None  # the run directory, opened once (its calls, tokens, run.json)
    policy: str | None = None
    excluded: dict[str, int] = field(default_factory=dict)
    id_mismatch: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)
    excluded_start_s: np.ndarray | None = None

    @property
    def run_dir(self) -> Path | None:
        return None if self.run is None else self.run.path


def load_source(
    path: Path | RunDir, block_size: int | None = None, need_capacity: bool = False
) -> Source:
    """The trace at `path`: a run directory, an Arrow token-id trace (by its magic bytes), or a
    JSONL trace recognised by its first line. `need_capacity`: no capacity is given, so a run
    directory that records none is refused before its calls are read."""
    if not isinstance(path, Path):  # a RunDir
        return load_run(path, block_size, need_capacity)
    if not path.exists():
        raise KvscopeError(f"{path} does not exist")
    if path.is_dir():
        return load_run(path, block_size, need_capacity)
    read = trace_reads(path, block_size)
    trace = gathered(path, read.block_size, read.chunks)
    return Source(read.kind, trace, notes=read.notes)


@dataclass(frozen=True)
class TraceReads:
    """A trace file being read: its kind (KINDS), block size, requests a chunk at a time in file
    order, and the notes about it (complete once the chunks are read to the end)."""

    kind: str
    block_size: int
    chunks: Iterator[Read]
    notes: list[str]


def trace_reads(path: Path, block_size: int | None) -> TraceReads:
    """A trace file read as `load_source` reads it (the same checks and errors), a chunk at a
    time: for a replay that does not hold the trace (sim/streamed.py)."""
    notes: list[str] = []
    if not path.is_file():
        raise KvscopeError(f"{path} is not a trace file")
    if formats.is_arrow(path):
        from kvscope.sim.inputs import arrow_tokens  # pyarrow: only where the trace is Arrow

        bs = _need_block_size(block_size, path, "an Arrow token-id trace")
        return TraceReads("tokens", bs, arrow_tokens.arrow_reads(path, bs, notes), notes)
    first = next(chunks.lines(path), None)
    if first is None:
        raise KvscopeError(f"{path} is empty: no requests to replay")
    if "hash_ids" in first[1]:
        bs = _need_block_size(block_size, path, "a Mooncake trace")
        return TraceReads("mooncake", bs, jsonl.mooncake_reads(path, bs), notes)
    if "token_ids" in first[1]:
        bs = _need_block_size(block_size, path, "a token-id trace")
        return TraceReads("tokens", bs, jsonl.token_reads(path, bs, notes), notes)
    raise KvscopeError(
        f"{path}:{first[0]}: neither a Mooncake line (hash_ids) nor a token-id line (token_ids)"
    )


def _need_block_size(block_size: int | None, path: Path, what: str) -> int:
    if block_size is None:
        raise KvscopeError(f"{path} is {what}: say its block size with --block-size")
    if block_size <= 0:
        raise KvscopeError(f"--block-size must be positive, got {block_size}")
    return block_size


# --- run directories ---------------------------------------------------------------------------


# the request table's columns a replay reads (a row of all ~70 is ~5 KB of Python objects)
RUN_COLUMNS = (
    "request_uuid", "status", "start_ns", "end_ns", "ttft_ms", "prefill_ms", "queue_ms",
    "cached_tokens", "prompt_tokens", "output_tokens", "agent_id", "workflow_run_id",
    "previous_agent_id", "engine_priority",
)  # fmt: skip


def load_run(
    run: RunDir | Path, block_size: int | None = None, need_capacity: bool = False
) -> Source:
    """A run directory's successful calls with token ids, in start order (see module doc)."""
    from kvscope.records.run_dir import RunDir
    from kvscope.records.tokens import TOKENS_ARROW
    from kvscope.sim.inputs.run_keys import PromptKeys
    from kvscope.sim.inputs.schedule import first_stores, scheduled_start, scheduled_starts

    run = RunDir.open(run)
    run_dir, table = run.path, run.requests  # KvscopeError: no request table
    if not run.has_tokens:
        raise KvscopeError(
            f"{run_dir} has no {TOKENS_ARROW}: Level 3 prompt token ids were not captured, "
            "so the run's prompts cannot be replayed"
        )
    info = run.info
    engine_cfg = (info.get("config") or {}).get("engine") or {}
    model = (info.get("environment") or {}).get("model") or {}
    run_bs = model.get("block_size") or engine_cfg.get("page_size")
    notes: list[str] = []
    if block_size is not None and run_bs is not None and block_size != run_bs:
        notes.append(f"block size {block_size} (the run's engine used {run_bs})")
    bs = block_size or run_bs
    if not bs:
        raise KvscopeError(f"{run_dir}/run.json does not record the block size: pass --block-size")
    capacity = model.get("capacity_tokens") or engine_cfg.get("kv_capacity_tokens")
    if need_capacity and not capacity:
        raise KvscopeError(f"{run_dir}/run.json records no KV capacity: give --capacity-tokens")

    prompts = PromptKeys.read(run_dir, int(bs))  # keys, not token ids, are held
    excluded: dict[str, int] = {}
    kept: list[dict[str, Any]] = []
    left_out: list[float] = []
    read = table.select([c for c in RUN_COLUMNS if c in table.column_names])
    for row in read.to_pylist():
        reason = _exclusion(row, prompts)
        if reason:
            excluded[reason] = excluded.get(reason, 0) + 1
            if row.get("start_ns") is not None:
                left_out.append(scheduled_start(row))
        else:
            kept.append(row)
    if not kept:
        raise KvscopeError(f"{run_dir}: no successful call with prompt token ids to replay")
    ids = [prompts.of(r["request_uuid"]) for r in kept]
    unclocked = sum(r.get("ttft_ms") is None or r.get("prefill_ms") is None for r in kept)
    if unclocked:
        notes.append(
            f"{unclocked} of {len(kept)} calls lack the engine's prefill time or a TTFT: they "
            "replay from when they were sent (plus any engine queue time), not when scheduled"
        )
    starts = scheduled_starts(kept, first_stores(run_dir), _stored_block_hit(kept, ids, int(bs)))
    order = sorted(range(len(kept)), key=lambda i: (starts[i], kept[i]["end_ns"]))
    kept, starts, ids = [kept[i] for i in order], starts[order], [ids[i] for i in order]
    lengths = [prompts.tokens(r["request_uuid"]) for r in kept]
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(k) for k in ids], out=offsets[1:])
    keys = np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint64)
    del ids, prompts  # the trace's keys are a copy in replay order
    measured = [r["cached_tokens"] for r in kept]
    end_s = np.maximum(np.array([r["end_ns"] / 1e9 for r in kept], dtype=np.float64), starts)
    trace = Trace(
        source=str(run_dir),
        block_size=int(bs),
        request_ids=tuple(r["request_uuid"] for r in kept),
        start_s=starts,
        end_s=end_s,
        prompt_tokens=np.array([r["prompt_tokens"] for r in kept], dtype=np.int64),
        output_tokens=np.array([r["output_tokens"] or 0 for r in kept], dtype=np.int64),
        keys=keys,
        offsets=offsets,
        agents=tuple(r["agent_id"] for r in kept),
        workflows=tuple(r["workflow_run_id"] for r in kept),
        previous_agents=tuple(r["previous_agent_id"] for r in kept),
        measured_cached_tokens=np.array(
            [math.nan if m is None else m for m in measured], dtype=np.float64
        ),
        capacity_tokens=int(capacity) if capacity else None,
        engine=_engine(info, notes),
        priorities=_priorities(kept),
        prefill_end_s=_prefill_ends(kept, starts, end_s),
    )
    mismatch = np.array([n != r["prompt_tokens"] for n, r in zip(lengths, kept, strict=True)])
    return Source(
        "run",
        trace,
        run,
        engine_cfg.get("eviction_policy"),
        excluded,
        mismatch,
        notes,
        np.sort(np.array(left_out, dtype=np.float64)),
    )


def _engine(info: dict[str, Any], notes: list[str]) -> str | None:
    """The run's engine semantics: the launched kind, or an attached engine's detected family."""
    kind = ((info.get("config") or {}).get("engine") or {}).get("kind")
    if kind in ("vllm", "sglang"):
        return kind
    family = ((info.get("environment") or {}).get("capabilities") or {}).get("family")
    if family is None:
        notes.append(f"engine {kind!r}: its kind was not detected, replayed as the default")
    return family


def _priorities(rows: list[dict[str, Any]]) -> np.ndarray | None:
    """The engine priority each call carried (0: none); None when no call carried one (or the
    run predates the column)."""
    carried = [r.get("engine_priority") for r in rows]
    if all(p is None for p in carried):
        return None
    return np.array([p or 0 for p in carried], dtype=np.int64)


def _prefill_ends(rows: list[dict[str, Any]], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """When each call's prompt became matchable: its first token (sent + TTFT), within
    [start, end]; its start without a TTFT."""
    first = [
        math.nan if r.get("ttft_ms") is None else r["start_ns"] / 1e9 + r["ttft_ms"] / 1e3
        for r in rows
    ]
    pe = np.array(first, dtype=np.float64)
    return np.maximum(np.minimum(np.where(np.isnan(pe), starts, pe), ends), starts)


def _exclusion(row: dict[str, Any], prompts: PromptKeys) -> str | None:
    from kvscope.records.requests import STATUS_OK

    if row.get("status") != STATUS_OK:
        return f"status {row.get('status')}"
    if row.get("request_uuid") not in prompts:
        return "no prompt token ids"
    if row.get("prompt_tokens") is None or row.get("start_ns") is None:
        return "no prompt_tokens or timing"
    return None


def _stored_block_hit(
    rows: list[dict[str, Any]], keys: list[np.ndarray], block_size: int
) -> Callable[[int, int], bool]:
    """after(i, j): call i's prompt holds a full block that call j stored (beyond j's hits)."""
    from kvscope.sim.inputs.run_keys import common_blocks

    def after(i: int, j: int) -> bool:
        common = common_blocks(keys[i], keys[j])
        return common > (rows[j].get("cached_tokens") or 0) // block_size

    return after
