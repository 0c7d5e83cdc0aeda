"""A run directory's streams -> its tables, the same at the end of a run and in `kvscope convert`.

Reads requests.jsonl, the /metrics series (metrics.parquet, else metrics.kvscope.jsonl),
prompt_tokens.jsonl and kv_events.jsonl; writes requests.parquet with the Level 2 context and
Level 3 provenance columns, kv_events.parquet (one row per block event), blocks.parquet (one row
per block life) and finalize.json (what was read and matched).
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from kvscope.collect.context import with_context
from kvscope.errors import KvscopeError
from kvscope.finalize.divergence import with_divergence
from kvscope.finalize.provenance import build_ledger, provenance
from kvscope.records import kv_events, metrics, requests
from kvscope.records.blocks import BLOCKS_PARQUET
from kvscope.records.finalized import Finalized, KvReport
from kvscope.records.tokens import load_tokens

Timings = Mapping[str, Mapping[str, float | None]]  # request_uuid -> the engine's own timings


def finalize(run_dir: Path, exported: Timings | None = None) -> Finalized:
    """Write the run's tables from its streams; `exported`: SGLang's request-metrics export."""
    rows, skipped = requests.read_rows(run_dir)
    series = metrics.load_series(run_dir)
    if series:
        rows = [with_context(r, series) for r in rows]
    if exported:
        rows = [_with_exported(r, exported.get(r["request_uuid"])) for r in rows]
    tokens = load_tokens(run_dir)
    if tokens:
        rows = with_divergence(rows, tokens)
    n_blocks = 0
    report = None
    if (run_dir / kv_events.KV_EVENTS_JSONL).exists():
        batches, _ = kv_events.read_batches(run_dir / kv_events.KV_EVENTS_JSONL)
        pq.write_table(kv_events.events_table(batches), run_dir / kv_events.KV_EVENTS_PARQUET)
        ledger = build_ledger(kv_events.events_of(batches))
        prov = provenance(rows, tokens, ledger)
        rows, n_blocks = prov.rows, prov.table.num_rows
        pq.write_table(prov.table, run_dir / BLOCKS_PARQUET)
        missing, recovered = kv_events.holes(batches)
        listener = None
        if (run_dir / kv_events.KV_SUMMARY).exists():
            listener = json.loads((run_dir / kv_events.KV_SUMMARY).read_text())
            missing = max(missing, listener.get("lost", 0))
        report = KvReport(
            batches=len(batches), events=sum(len(b.events) for b in batches),
            missing_batches=missing, recovered_batches=recovered,
            orphan_blocks=ledger.orphan_blocks, skipped=prov.skipped,
            queue_unknown=prov.queue_unknown, listener=listener,
        )  # fmt: skip
    requests.write_table(run_dir, rows)
    context = sum(r.get("cache_used_tokens_before") is not None for r in rows)
    done = Finalized(len(rows), skipped, context, n_blocks, report)
    done.write(run_dir)
    return done


def convert(run_dir: Path) -> Finalized:
    """A run directory's tables from its streams alone (a crashed run's, for instance)."""
    if not (run_dir / requests.REQUESTS_JSONL).exists():
        raise KvscopeError(
            f"{run_dir} has no {requests.REQUESTS_JSONL}: not a kvscope run directory"
        )
    return finalize(run_dir)


def _with_exported(
    row: dict[str, Any], timings: Mapping[str, float | None] | None
) -> dict[str, Any]:
    if not timings:
        return row
    return row | {k: v for k, v in timings.items() if v is not None and row.get(k) is None}
