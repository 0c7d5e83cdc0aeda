"""The design note's metric definitions, on its own worked examples."""

from typing import Any

import pytest

from kvscope.analysis.agents import per_agent, percentile, recompute_burden, weighted_hit_ratio
from kvscope.records.requests import derived_cache


def row(agent: str, prompt: int | None, cached: int | None, **extra: Any) -> dict[str, Any]:
    base = {
        "agent_id": agent, "prompt_tokens": prompt, "cached_tokens": cached, "status": "ok",
        "ttft_ms": None, "tpot_ms": None, "e2e_ms": None, "tool_ms": None,
    }  # fmt: skip
    return base | extra


def test_weighted_hit_ratio_worked_example() -> None:
    rows = [row("a", 100, 90), row("b", 10000, 1000)]
    assert weighted_hit_ratio(rows) == pytest.approx(1090 / 10100)
    assert round(weighted_hit_ratio(rows) * 100, 1) == 10.8
    simple = sum(r["cached_tokens"] / r["prompt_tokens"] for r in rows) / 2
    assert simple == pytest.approx(0.5)  # the misleading simple average


def test_recompute_burden_worked_example() -> None:
    rows = [
        row("planner", 4000, 3000),
        row("executor", 8000, 2000),
        row("expresser", 5000, 4500),
        row("reviewer", 3000, 1000),
    ]
    assert recompute_burden(rows) == 9500


def test_unmeasured_is_null_not_zero() -> None:
    assert derived_cache(100, None) == (None, None)
    assert derived_cache(None, 5) == (None, None)
    assert derived_cache(100, 120) == (0, 1.2)  # new prefill is clamped at 0
    assert derived_cache(0, 0) == (0, None)
    rows = [row("a", 100, None)]
    assert weighted_hit_ratio(rows) is None
    assert recompute_burden(rows) is None
    # rows without a cached count do not dilute the ratio of those with one
    assert weighted_hit_ratio([*rows, row("a", 50, 25)]) == 0.5


def test_percentile_linear() -> None:
    assert percentile([], 50) is None
    assert percentile([None, 3.0], 95) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 95) == 95


def test_per_agent_summary_orders_agents_and_skips_failures() -> None:
    rows = [
        row("reviewer", 300, 100, e2e_ms=30.0),
        row("planner", 400, 0, e2e_ms=10.0),
        row("planner", 400, 384, e2e_ms=20.0),
        row("planner", None, None, status="timeout", error_type="timeout"),
        row("executor", 500, 256, tool_ms=2.5),
    ]
    summary = {s.agent_id: s for s in per_agent(rows)}
    # first appearance (same start_ns: the row that comes first), no fixed agent names
    assert [s.agent_id for s in per_agent(rows)] == ["reviewer", "planner", "executor"]
    planner = summary["planner"]
    assert (planner.calls, planner.failed) == (3, 1)
    assert planner.cached_tokens == 384
    assert planner.cached_tokens_p50 == 192  # per call: 0 and 384
    assert planner.new_prefill_tokens_p50 == 208  # per call: 400 and 16
    assert planner.new_prefill_tokens == 416
    assert planner.weighted_hit_ratio == pytest.approx(384 / 800)
    assert planner.e2e_p50_ms == 15.0
    assert planner.ttft_p50_ms is None
    assert summary["executor"].tool_ms == 2.5
    assert summary["reviewer"].tool_ms is None
