"""RQ5: sharing modes compared."""

import pytest
from request_tables import request, table

from kvscope.analysis.across_runs import sharing_comparison


def calls(mode: str | None, planner: int, executor: int, ttft: float) -> list[dict]:
    return [
        request(
            agent_id="planner",
            sharing_mode=mode,
            prompt_tokens=1000,
            cached_tokens=planner,
            ttft_ms=ttft,
        ),
        request(
            agent_id="executor",
            sharing_mode=mode,
            prompt_tokens=1000,
            cached_tokens=executor,
            ttft_ms=2 * ttft,
            cached_cross_agent_tokens=executor,
        ),
    ]


def test_modes_in_order_with_ratio_burden_and_ttft() -> None:
    t = sharing_comparison(
        {
            "docs": table(*calls("documents", 800, 900, 10.0)),
            "none": table(*calls("none", 0, 0, 40.0)),
            "mixed": table(*calls("system", 200, 300, 30.0), *calls(None, 0, 100, 50.0)),
        }
    )
    keys = [(r["sharing_mode"], r["run"], r["agent_id"]) for r in t.to_pylist()]
    assert keys == [
        ("none", "none", "planner"),
        ("none", "none", "executor"),
        ("none", "none", "all"),
        ("system", "mixed", "planner"),
        ("system", "mixed", "executor"),
        ("system", "mixed", "all"),
        ("documents", "docs", "planner"),
        ("documents", "docs", "executor"),
        ("documents", "docs", "all"),
        ("unknown", "mixed", "planner"),
        ("unknown", "mixed", "executor"),
        ("unknown", "mixed", "all"),
    ]
    got = {(r["sharing_mode"], r["agent_id"]): r for r in t.to_pylist()}
    docs = got[("documents", "all")]
    assert docs["weighted_hit_ratio"] == pytest.approx(1700 / 2000)
    assert docs["recompute_burden"] == 300
    assert docs["ttft_p50_ms"] == pytest.approx(15)
    assert docs["cached_cross_agent_tokens"] == 900
    assert got[("none", "executor")]["weighted_hit_ratio"] == 0.0
    assert got[("none", "executor")]["recompute_burden"] == 1000
    assert got[("system", "planner")]["ttft_p50_ms"] == pytest.approx(30)
    assert got[("unknown", "executor")]["weighted_hit_ratio"] == pytest.approx(0.1)
