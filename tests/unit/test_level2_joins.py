"""Level-2 joins: per-request context from samples, server timings, reconciliation, the plot."""

from collections.abc import Iterable
from pathlib import Path

import pytest

from kvscope.analysis.reconcile import reconcile
from kvscope.collect.context import context_columns
from kvscope.report.timeline import plot

SERIES = {
    "kv_used_tokens": [(100, 0.0), (200, 512.0), (300, 1024.0), (400, 640.0)],
    "kv_usage": [(100, 0.0), (200, 0.25), (300, 0.5), (400, 0.3125)],
    "kv_capacity_tokens": [(100, 2048.0)],
    "running_requests": [(100, 0.0), (200, 1.0), (300, 2.0), (400, 0.0)],
    "queued_requests": [(100, 0.0), (200, 0.0), (300, 1.0), (400, 0.0)],
}


def test_context_columns() -> None:
    row = {"start_ns": 250, "end_ns": 350}
    out = context_columns(row, SERIES)
    assert out["cache_used_tokens_before"] == 512
    assert out["cache_used_tokens_after"] == 640
    assert out["cache_utilization_before"] == 0.25
    assert out["cache_utilization_after"] == 0.3125
    assert (out["running_requests"], out["queued_requests"]) == (1, 0)
    missing = context_columns(row, {})
    assert missing["cache_used_tokens_before"] is None and missing["running_requests"] is None


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
