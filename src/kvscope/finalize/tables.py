"""A run directory's streams -> its tables, the same at the end of a run and in `kvscope convert`.

Reads requests.jsonl, the prompt-token stream (prompt_tokens.arrow) and, per KV cache, its
/metrics series (metrics.parquet, else metrics.kvscope.jsonl) and KV event stream
(kv_events.arrow; an older run's JSONL streams the same way: records.tokens, records.kv_events);
writes requests.parquet with the Level 2 context and Level 3 provenance columns,
kv_events.parquet (one row per block event), blocks.parquet (one row per block life) and
finalize.json (what was read and matched).

One engine has one cache: its streams are in the run directory. A deployment (replicas behind a
router) has one per replica, in replicas/<name>/ (records.run_dir.replica_dirs): each call is
placed on the replica that served it (finalize.replicas), gets its context and provenance from
that replica's streams alone (a block on replica A is not a hit on replica B), and its routing
miss from all of them (finalize.routing_misses); the event and block tables carry a `replica`
column.
"""

import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from kvscope.collect.context import SERIES as CONTEXT_SERIES
from kvscope.collect.context import context_columns
from kvscope.errors import KvscopeError
from kvscope.finalize import replicas, working
from kvscope.finalize.divergence import with_divergence
from kvscope.finalize.kvcolumns import KvColumns, events_table, read_columns
from kvscope.finalize.ledger import ledger_of
from kvscope.finalize.prompts import Prompts, load_prompts
from kvscope.finalize.provenance import Ledger, Provenance, provenance
from kvscope.finalize.routing_misses import routing_columns
from kvscope.finalize.thread_turns import with_thread_turns
from kvscope.records import kv_events, metrics, requests
from kvscope.records.blocks import BLOCKS_PARQUET, BLOCKS_SCHEMA
from kvscope.records.finalized import Finalized, KvReport
from kvscope.records.run_dir import (
    ENGINE_LOG,
    SGLANG_REQUEST_LOGS,
    SGLANG_REQUEST_METRICS,
    replica_dirs,
)

Timings = Mapping[str, Mapping[str, float | None]]  # request_uuid -> the engine's own timings
Row = dict[str, Any]
UNPLACED = "serving replica unknown"  # a deployment's call no replica log or event names


@dataclass(frozen=True)
class _Cache:
    """One KV cache's streams: the engine's (name None) or one replica's."""

    name: str | None
    folder: Path
    events: KvColumns | None  # None: no KV events were recorded

    @classmethod
    def read(cls, name: str | None, folder: Path) -> "_Cache":
        path = kv_events.events_path(folder)
        return cls(name, folder, read_columns(path) if path is not None else None)

    def listener(self) -> dict[str, Any] | None:
        path = self.folder / kv_events.KV_SUMMARY
        return json.loads(path.read_text()) if path.exists() else None


def finalize(run_dir: Path, exported: Timings | None = None) -> Finalized:
    """Write the run's tables from its streams; `exported`: SGLang's request-metrics export."""
    named = replica_dirs(run_dir)
    with ThreadPoolExecutor(1) as pool:  # the prompt tokens read while the request stream is,
        # the KV events while divergence runs: each side waits mostly on Arrow or numpy, which
        # let the other thread run (a second core is otherwise idle here)
        prompts = pool.submit(load_prompts, run_dir)
        stream = working.read(run_dir)  # the passes set their columns on its rows, in place
        rows = with_thread_turns(stream.rows)
        for r in rows if exported else ():
            _add_exported(r, exported.get(r["request_uuid"]))
        tokens = prompts.result()
        reading = pool.submit(_read_caches, run_dir, named)
        if tokens:
            rows = with_divergence(rows, tokens)
        caches = reading.result()
    if named:
        rows = _placed(rows, caches)
    context = _with_context(rows, caches)
    rows, n_blocks, report, found = _provenance(run_dir, rows, tokens, caches)
    del tokens, caches  # the largest inputs, freed before the rows grow and the table is built
    for p in found:
        p.apply()
    pq.write_table(working.table_with(stream.table, rows), run_dir / requests.REQUESTS_PARQUET)
    done = Finalized(len(rows), stream.skipped, context, n_blocks, report)
    done.write(run_dir)
    return done


def _read_caches(run_dir: Path, named: Mapping[str, Path]) -> list[_Cache]:
    """The engine's cache, or a deployment's replicas' (`named`), their KV events read."""
    return [_Cache.read(n, f) for n, f in named.items()] or [_Cache.read(None, run_dir)]


def _with_context(rows: list[Row], caches: list[_Cache]) -> int:
    """The server context columns set on each row from its cache's /metrics series; how many
    rows have them."""
    for c in caches:
        if series := metrics.load_series(c.folder, CONTEXT_SERIES):
            mine = [r for r in rows if r.get("replica") == c.name]
            ends = [r["end_ns"] for r in mine]
            cols = context_columns([r["start_ns"] for r in mine], ends, series)
            for r, values in zip(mine, zip(*cols.values(), strict=True), strict=True):
                r.update(zip(cols, values, strict=True))
    return sum(r.get("cache_used_tokens_before") is not None for r in rows)


def _placed(rows: list[Row], caches: list[_Cache]) -> list[Row]:
    """A deployment's rows with the replica that served each (finalize.replicas); an SGLang
    replica's exported timings set on the rows it served."""
    logs: dict[str, str] = {}
    seen: dict[str, replicas.Seen] = {}
    for c in caches:
        log = c.folder / ENGINE_LOG
        logs[str(c.name)] = log.read_text(errors="replace") if log.exists() else ""
        seen[str(c.name)] = replicas.sglang_requests(_lines(c.folder / SGLANG_REQUEST_LOGS))
    stored = {str(c.name): c.events.session_id.to_pylist() if c.events else [] for c in caches}
    rows = replicas.place(rows, logs, stored, seen)
    for c in caches:
        _add_replica_exported(rows, str(c.name), seen[str(c.name)], c.folder)
    return rows


def _lines(folder: Path) -> Iterator[str]:
    """Every line of every file in `folder` (none where it is missing)."""
    for path in sorted(folder.glob("*")) if folder.is_dir() else ():
        with path.open(errors="replace") as f:
            yield from f


def _add_replica_exported(rows: list[Row], name: str, seen: replicas.Seen, folder: Path) -> None:
    """The timings an SGLang replica exported (--export-metrics-to-file, by its own rids) set on
    the rows placed on it: a rid is a row's by the x-request-id its request log names with it,
    or by the row's reply id."""
    from kvscope.engines.sglang import export_line_timings

    mine = {r["request_uuid"]: r for r in rows if r.get("replica") == name}
    by_rid = {r["sglang_response_id"]: r for r in mine.values() if r.get("sglang_response_id")}
    by_rid |= {rid: mine[h] for rid, h in seen.items() if h in mine}
    for line in _lines(folder / SGLANG_REQUEST_METRICS) if by_rid else ():
        rid, timings = export_line_timings(line)
        if rid is not None and rid in by_rid:
            _add_exported(by_rid[rid], timings)


def _provenance(
    run_dir: Path, rows: list[Row], tokens: Prompts, caches: list[_Cache]
) -> tuple[list[Row], int, KvReport | None, list[Provenance]]:
    """Provenance per cache (its columns pending: Provenance.apply), routing misses across them;
    the event and block tables written, each cache's as soon as it is made."""
    with_events = [c for c in caches if c.events is not None]
    if not with_events:
        return rows, 0, None, []
    ledgers, reports, n_blocks, found = {}, [], 0, []
    with (
        pq.ParquetWriter(run_dir / kv_events.KV_EVENTS_PARQUET, kv_events.EVENTS_SCHEMA) as ev,
        pq.ParquetWriter(run_dir / BLOCKS_PARQUET, BLOCKS_SCHEMA) as bl,
    ):
        for c in with_events:
            assert c.events is not None
            ev.write_table(events_table(c.events, c.name))
            ledger = ledger_of(c.events)
            mine = [r for r in rows if r.get("replica") == c.name]
            prov = provenance(mine, tokens, ledger, c.name, defer=True)
            bl.write_table(prov.table)
            n_blocks += prov.table.num_rows
            ledgers[str(c.name)] = ledger
            reports.append(_report(c, ledger, prov.skipped, prov.queue_unknown))
            found.append(replace(prov, table=prov.table.schema.empty_table()))  # written
            del prov
    if caches[0].name is not None:
        rows = routing_columns(rows, tokens, ledgers)
    report = reports[0] if caches[0].name is None else _merged(reports, with_events, rows)
    return rows, n_blocks, report, found


def _report(c: _Cache, ledger: Ledger, skipped: dict[str, int], unknown: int) -> KvReport:
    assert c.events is not None
    missing, recovered = c.events.missing, c.events.recovered
    listener = c.listener()
    if listener is not None:
        missing = max(missing, listener.get("lost", 0))
    return KvReport(
        batches=c.events.batches, events=len(c.events),
        missing_batches=missing, recovered_batches=recovered,
        orphan_blocks=ledger.orphan_blocks, skipped=skipped,
        queue_unknown=unknown, listener=listener,
    )  # fmt: skip


def _merged(reports: list[KvReport], caches: list[_Cache], rows: list[Row]) -> KvReport:
    """A deployment's report: the replicas' counts summed, their listeners by replica."""
    skipped: dict[str, int] = {}
    for r in reports:
        for reason, n in r.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
    if unplaced := sum(r.get("replica") is None for r in rows):
        skipped[UNPLACED] = unplaced
    return KvReport(
        batches=sum(r.batches for r in reports), events=sum(r.events for r in reports),
        missing_batches=sum(r.missing_batches for r in reports),
        recovered_batches=sum(r.recovered_batches for r in reports),
        orphan_blocks=sum(r.orphan_blocks for r in reports), skipped=skipped,
        queue_unknown=sum(r.queue_unknown for r in reports),
        listener={str(c.name): r.listener for c, r in zip(caches, reports, strict=True)},
    )  # fmt: skip


def convert(run_dir: Path) -> Finalized:
    """A run directory's tables from its streams alone (a crashed run's, for instance)."""
    if not (run_dir / requests.REQUESTS_JSONL).exists():
        raise KvscopeError(
            f"{run_dir} has no {requests.REQUESTS_JSONL}: not a kvscope run directory"
        )
    return finalize(run_dir)


def _add_exported(row: Row, timings: Mapping[str, float | None] | None) -> None:
    """The engine's exported timings set on the row where it has none."""
    for k, v in (timings or {}).items():
        if k in working.EXPORTED and v is not None and row.get(k) is None:
            row[k] = v
