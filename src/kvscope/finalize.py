"""A run directory's streams -> its tables, the same at the end of a run and in `kvscope convert`.

Streams (appended while the run goes, so a crash keeps them): requests.jsonl (one row per call),
metrics.kvscope.jsonl (kvscope's /metrics values per scrape; metrics.parquet once the run ended),
prompt_tokens.jsonl (each call's exact prompt token ids), kv_events.jsonl (the engine's KV
events). Tables: requests.parquet with the Level 2 context and Level 3 provenance columns,
kv_events.parquet (one row per block event), blocks.parquet (one row per block life).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvscope import store
from kvscope.analysis.divergence import with_divergence
from kvscope.analysis.provenance import build_ledger, provenance
from kvscope.collect import kv_events
from kvscope.collect.context import with_context
from kvscope.collect.metrics import instant_series, instant_series_jsonl
from kvscope.errors import KvscopeError

METRICS_PARQUET = "metrics.parquet"
METRICS_JSONL = "metrics.kvscope.jsonl"
TOKENS_JSONL = "prompt_tokens.jsonl"
KV_EVENTS_JSONL = "kv_events.jsonl"
KV_EVENTS_PARQUET = "kv_events.parquet"
KV_SUMMARY = "kv_events.summary.json"
BLOCKS_PARQUET = "blocks.parquet"

Series = dict[str, list[tuple[int, float]]]


@dataclass(frozen=True)
class KvReport:
    batches: int
    events: int
    missing_batches: int  # sequence numbers never received, live or by replay
    recovered_batches: int  # received only through the replay socket
    orphan_blocks: int  # stored on a parent never seen: cannot be matched to prompts
    skipped: dict[str, int] = field(default_factory=dict)  # requests without provenance, why
    listener: dict[str, Any] | None = None  # the listener's own summary (gaps with times)


@dataclass(frozen=True)
class Tables:
    rows: list[dict[str, Any]]
    skipped_lines: int
    series: Series
    blocks: list[dict[str, Any]]
    kv: KvReport | None


def finalize(run_dir: Path, exported: dict[str, dict[str, float | None]] | None = None) -> Tables:
    rows, skipped = store.read_jsonl(run_dir / store.REQUESTS_JSONL)
    series = load_series(run_dir)
    if series:
        rows = [with_context(r, series) for r in rows]
    if exported:
        rows = [_with_exported(r, exported.get(r["request_uuid"])) for r in rows]
    tokens = load_tokens(run_dir)
    if tokens:
        rows = with_divergence(rows, tokens)
    blocks: list[dict[str, Any]] = []
    report = None
    if (run_dir / KV_EVENTS_JSONL).exists():
        batches, _ = kv_events.read_batches(run_dir / KV_EVENTS_JSONL)
        pq.write_table(kv_events.to_table(batches), run_dir / KV_EVENTS_PARQUET)
        ledger = build_ledger(kv_events.events_of(batches))
        prov = provenance(rows, tokens, ledger)
        rows, blocks = prov.rows, prov.blocks
        pq.write_table(pa.Table.from_pylist(blocks, schema=BLOCKS_SCHEMA), run_dir / BLOCKS_PARQUET)
        missing, recovered = kv_events.holes(batches)
        listener = None
        if (run_dir / KV_SUMMARY).exists():
            listener = json.loads((run_dir / KV_SUMMARY).read_text())
            missing = max(missing, listener.get("lost", 0))
        report = KvReport(
            batches=len(batches), events=sum(len(b["events"]) for b in batches),
            missing_batches=missing, recovered_batches=recovered,
            orphan_blocks=ledger.orphan_blocks, skipped=prov.skipped, listener=listener,
        )  # fmt: skip
    store.write_requests(run_dir, rows)
    return Tables(rows, skipped, series, blocks, report)


def convert(run_dir: Path) -> Tables:
    """A run directory's tables from its streams alone (a crashed run's, for instance)."""
    if not (run_dir / store.REQUESTS_JSONL).exists():
        raise KvscopeError(f"{run_dir} has no {store.REQUESTS_JSONL}: not a kvscope run directory")
    return finalize(run_dir)


def load_series(run_dir: Path) -> Series:
    if (run_dir / METRICS_PARQUET).exists():
        return instant_series(pq.read_table(run_dir / METRICS_PARQUET))
    if (run_dir / METRICS_JSONL).exists():
        return instant_series_jsonl(run_dir / METRICS_JSONL)
    return {}


def load_tokens(run_dir: Path) -> dict[str, list[int]]:
    path = run_dir / TOKENS_JSONL
    rows = store.read_jsonl(path)[0] if path.exists() else []
    return {r["request_uuid"]: r["token_ids"] for r in rows}


class TokenLog:
    """Appends each call's prompt token ids (one JSON line, flushed) to prompt_tokens.jsonl."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")

    def append(self, request_uuid: str, token_ids: tuple[int, ...]) -> None:
        row = {"request_uuid": request_uuid, "token_ids": list(token_ids)}
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _with_exported(row: dict[str, Any], timings: dict[str, float | None] | None) -> dict[str, Any]:
    if not timings:
        return row
    return row | {k: v for k, v in timings.items() if v is not None and row.get(k) is None}


BLOCKS_SCHEMA = pa.schema([
    pa.field("block_hash", pa.int64(), nullable=False),
    pa.field("tokens", pa.int32()),
    pa.field("stored_ns", pa.int64()),
    pa.field("removed_ns", pa.int64()),
    pa.field("removal", pa.string()),  # evicted | cleared | null (still cached at the end)
    pa.field("residency_ms", pa.float64()),
    pa.field("owner_request_uuid", pa.string()),
    pa.field("owner_agent_id", pa.string()),
    pa.field("owner_workflow_run_id", pa.string()),
    pa.field("owner_turn_id", pa.int64()),
    pa.field("attribution", pa.string()),  # session_id | tokens | null
    pa.field("hits", pa.int64()),  # later requests served by this block
    pa.field("evictor_request_uuid", pa.string()),
    pa.field("evictor_agent_id", pa.string()),
    pa.field("evictor_workflow_run_id", pa.string()),
    pa.field("evictor_inferred", pa.string()),  # how: same-step store | in flight
    pa.field("harmful", pa.bool_()),
    pa.field("recomputed_tokens", pa.int64()),
    pa.field("needed_by_request_uuid", pa.string()),
    pa.field("needed_by_agent_id", pa.string()),
    pa.field("needed_by_transition", pa.string()),
])  # fmt: skip
