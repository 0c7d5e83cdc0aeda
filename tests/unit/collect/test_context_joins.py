"""Level-2 joins: per-request context from samples, server timings, reconciliation, the plot."""

import random
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvscope.analysis.reconcile import reconcile
from kvscope.collect.context import context_columns
from kvscope.collect.series import nearest
from kvscope.records import metrics
from kvscope.report.timeline import plot

SERIES = {
    "kv_used_tokens": [(100, 0.0), (200, 512.0), (300, 1024.0), (400, 640.0)],
    "kv_usage": [(100, 0.0), (200, 0.25), (300, 0.5), (400, 0.3125)],
    "kv_capacity_tokens": [(100, 2048.0)],
    "running_requests": [(100, 0.0), (200, 1.0), (300, 2.0), (400, 0.0)],
    "queued_requests": [(100, 0.0), (200, 0.0), (300, 1.0), (400, 0.0)],
}


def test_context_columns() -> None:
    out = context_columns([250, 50, 300, 400], [350, 450, 300, 400], SERIES)
    assert out["cache_used_tokens_before"] == [512, None, 1024, 640]  # at or before the start
    assert out["cache_used_tokens_after"] == [640, None, 1024, 640]  # at or after the end
    assert out["cache_utilization_before"] == [0.25, None, 0.5, 0.3125]
    assert out["cache_utilization_after"] == [0.3125, None, 0.5, 0.3125]
    assert out["running_requests"] == [1, None, 2, 0] and out["queued_requests"] == [0, None, 1, 0]
    missing = context_columns([250], [350], {})
    assert missing["cache_used_tokens_before"] == [None] and missing["running_requests"] == [None]


def first_to_last(values: Iterable[float]) -> float | None:
    v = list(values)
    return v[-1] - v[0] if v else None


def test_reconciliation_shows_agreement_and_mismatch() -> None:
    rows = [
        {"prompt_tokens": 700, "cached_tokens": 0},
        {"prompt_tokens": 710, "cached_tokens": 640},
        {"prompt_tokens": None, "cached_tokens": None},  # a failed call
    ]
    counters = {"prompt_tokens_total": [100.0, 1510.0], "cached_tokens_total": [0.0, 768.0]}
    result = {r.counter: r for r in reconcile(rows, counters, first_to_last)}
    prompt, cached = result["prompt_tokens_total"], result["cached_tokens_total"]
    assert (prompt.requests_sum, prompt.engine_delta, prompt.exact) == (1410, 1410.0, True)
    assert (cached.requests_sum, cached.engine_delta, cached.difference) == (640, 768.0, 128.0)
    assert cached.exact is False and cached.unmeasured_rows == 1
    none = {r.counter: r for r in reconcile(rows, {}, first_to_last)}
    assert none["cached_tokens_total"].exact is None  # no counter: unknown, not "agrees"


@pytest.mark.parametrize("with_series", [True, False])
def test_timeline_plot_is_written(tmp_path: Path, with_series: bool) -> None:
    rows = [
        {"thread_id": f"run-t00{i}", "agent_id": a, "start_ns": 100 + 40 * j, "status": s,
         "end_ns": 130 + 40 * j}
        for i in range(2)
        for j, (a, s) in enumerate([("planner", "ok"), ("executor", "ok"), ("reviewer", "error")])
    ]  # fmt: skip
    path = plot(rows, SERIES if with_series else {}, tmp_path / "timeline.png", "test")
    assert path.exists() and path.stat().st_size > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_context_columns_pick_the_samples_nearest_picks() -> None:
    r = random.Random(3)
    for _ in range(50):
        times = sorted(r.sample(range(1000), r.randrange(6)))
        series = {n: [(t, r.random() * 2000) for t in times] for n in SERIES}
        starts = [r.randrange(-10, 1010) for _ in range(20)]
        ends = [s + r.randrange(50) for s in starts]
        out = context_columns(starts, ends, series)
        used = series["kv_used_tokens"]
        want = [nearest(used, t, "after") for t in ends]
        assert out["cache_used_tokens_after"] == [None if v is None else round(v) for v in want]
        want = [nearest(series["kv_usage"], t, "before") for t in starts]
        assert out["cache_utilization_before"] == want


def test_load_series_reads_kvscope_rows_only_and_the_names_asked(tmp_path: Path) -> None:
    rows = [
        (300, "kvscope:kv_usage", "kv_usage", 0.5), (100, "kvscope:kv_usage", "kv_usage", 0.1),
        (100, "vllm:kv_cache_usage_perc", "kv_usage", 0.9),  # the engine's, under kvscope's name
        (100, "kvscope:running_requests", "running_requests", 2.0),
    ]  # fmt: skip
    cols = list(zip(*rows, strict=True))
    table = pa.table({
        "timestamp_ns": cols[0], "benchmark_run_id": ["b"] * 4, "metric_name": cols[1],
        "labels": ["{}"] * 4, "value": cols[3], "kvscope_name": cols[2],
    }, schema=metrics.SCHEMA)  # fmt: skip
    pq.write_table(table, tmp_path / metrics.METRICS_PARQUET, row_group_size=2)
    assert metrics.load_series(tmp_path) == {
        "kv_usage": [(100, 0.1), (300, 0.5)],
        "running_requests": [(100, 2.0)],
    }
    assert metrics.load_series(tmp_path, ["kv_usage"]) == {"kv_usage": [(100, 0.1), (300, 0.5)]}
