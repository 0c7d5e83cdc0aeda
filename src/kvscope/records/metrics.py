"""The /metrics streams: every engine sample per scrape (metrics.parquet, long format), the
scrapes that failed and the sampler's numbers (metrics.gaps.json), and kvscope's own instant values
per scrape (metrics.kvscope.jsonl, appended while the run goes so that a crashed run keeps them).

Rows whose metric_name starts with "kvscope:" carry kvscope's instant values (kv_used_tokens,
running_requests, ...), so that joins downstream need no engine's metric map.
"""

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvscope.records.base import arrow_schema, record_dict

METRICS_PARQUET = "metrics.parquet"
METRICS_GAPS = "metrics.gaps.json"
METRICS_JSONL = "metrics.kvscope.jsonl"
KVSCOPE_PREFIX = "kvscope:"

Series = dict[str, list[tuple[int, float]]]  # kvscope name -> [(timestamp_ns, value)], in order


@dataclass(frozen=True)
class MetricSample:
    """One row of metrics.parquet."""

    timestamp_ns: int
    benchmark_run_id: str
    metric_name: str
    labels: str  # JSON object, sorted keys
    value: float
    kvscope_name: str | None  # null: a sample kvscope has no name for


SCHEMA = arrow_schema(MetricSample)


@dataclass(frozen=True)
class InstantValues:
    """One line of metrics.kvscope.jsonl: kvscope's instant values of one scrape."""

    ts: int  # timestamp_ns of the scrape
    values: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


@dataclass(frozen=True)
class ScrapeGap:
    timestamp_ns: int  # when the failed scrape was sent
    error: str


@dataclass(frozen=True)
class ScrapeSummary:
    scrapes: int  # attempted
    errors: int  # gaps
    rows: int
    duration_s: float  # start() to stop()
    samples_per_s: float  # successful scrapes per second of duration
    skipped_ticks: int  # whole intervals lost because scrapes ran past their deadline


def write_gaps(
    path: Path, header: dict[str, Any], summary: ScrapeSummary, gaps: list[ScrapeGap]
) -> None:
    doc = header | {"summary": record_dict(summary), "gaps": [record_dict(g) for g in gaps]}
    path.write_text(json.dumps(doc, indent=2) + "\n")


def read_gaps(path: Path) -> tuple[ScrapeSummary, list[ScrapeGap]]:
    doc = json.loads(path.read_text())
    return ScrapeSummary(**doc["summary"]), [ScrapeGap(**g) for g in doc["gaps"]]


def labelled(path: Path, **labels: str) -> None:
    """Add `labels` to every sample of the metrics.parquet at `path` (a replica's name)."""
    table = pq.read_table(path)
    column = [
        json.dumps(json.loads(text or "{}") | labels, sort_keys=True)
        for text in table["labels"].to_pylist()
    ]
    index = table.schema.get_field_index("labels")
    field = table.schema.field(index)
    pq.write_table(table.set_column(index, field, pa.array(column, field.type)), path)


def instant_series(table: pa.Table) -> Series:
    """kvscope instant value -> [(timestamp_ns, value)] in time order, from a written series."""
    rows = table.filter(pc.starts_with(table["metric_name"], KVSCOPE_PREFIX))
    rows = rows.sort_by("timestamp_ns").select(["kvscope_name", "timestamp_ns", "value"])
    out: Series = {}
    for name, ts, v in zip(*(rows[c].to_pylist() for c in rows.column_names), strict=True):
        out.setdefault(name, []).append((ts, v))
    return out


def instant_series_jsonl(path: Path) -> Series:
    """The same, from the per-scrape JSONL a run appends while it goes (torn lines skipped)."""
    out: Series = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            for name, v in row["values"].items():
                out.setdefault(name, []).append((row["ts"], v))
    for points in out.values():
        points.sort()
    return out


def load_table(run_dir: Path) -> pa.Table | None:
    """metrics.parquet, or None when the run has none."""
    path = run_dir / METRICS_PARQUET
    return pq.read_table(path) if path.exists() else None


def _kvscope_rows(batch: pa.RecordBatch, names: Collection[str] | None) -> pa.RecordBatch:
    mine = pc.starts_with(batch["metric_name"], KVSCOPE_PREFIX)
    if names is not None:
        mine = pc.and_(mine, pc.is_in(batch["kvscope_name"], pa.array(list(names), pa.string())))
    return batch.filter(mine)


def load_series(run_dir: Path, names: Collection[str] | None = None) -> Series:
    """kvscope's instant values (`names`: only these), from metrics.parquet, else from the JSONL
    of a crashed run.

    The Parquet file is read a batch at a time, keeping only kvscope's rows of the three columns
    needed (a 100k-call run's 3.4 M samples, read whole, took ~0.7 GB)."""
    path = run_dir / METRICS_PARQUET
    if path.exists():
        file = pq.ParquetFile(path)
        columns = ["metric_name", "kvscope_name", "timestamp_ns", "value"]
        schema = pa.schema([file.schema_arrow.field(c) for c in columns])
        kept = [
            _kvscope_rows(b, names)
            for b in file.iter_batches(1 << 16, columns=columns, use_threads=False)
        ]
        return instant_series(pa.Table.from_batches(kept, schema))
    if (run_dir / METRICS_JSONL).exists():
        series = instant_series_jsonl(run_dir / METRICS_JSONL)
        return series if names is None else {k: v for k, v in series.items() if k in names}
    return {}
