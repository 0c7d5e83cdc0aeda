"""RQ3: prompt layouts compared, per run and agent."""

import pytest
from request_tables import request, table

from kvscope.analysis.across_runs import layout_comparison


def test_layouts_side_by_side() -> None:
    shared = table(
        request(
            agent_id="planner",
            prompt_layout="shared-first",
            prompt_tokens=1000,
            cached_tokens=800,
            first_divergence_previous_agent=900,
            max_reusable_tokens=950,
            cached_cross_agent_tokens=500,
        ),
        request(
            agent_id="planner",
            prompt_layout="shared-first",
            prompt_tokens=1000,
            cached_tokens=600,
            first_divergence_previous_agent=700,
            max_reusable_tokens=750,
        ),
        request(
            agent_id="executor", prompt_layout="shared-first", prompt_tokens=500, cached_tokens=0
        ),
    )
    role = table(
        request(
            agent_id="planner",
            prompt_layout="role-first",
            prompt_tokens=1000,
            cached_tokens=100,
            first_divergence_previous_agent=50,
            max_reusable_tokens=900,
            cached_cross_agent_tokens=0,
        ),
        request(
            agent_id="planner",
            prompt_layout="role-first",
            prompt_tokens=1000,
            cached_tokens=0,
            first_divergence_previous_agent=999,
            status="error",
        ),
    )
    unknown = table(request(agent_id="planner", prompt_tokens=10, cached_tokens=5))
    t = layout_comparison({"A": shared, "B": role, "C": unknown})
    got = {(r["run"], r["agent_id"]): r for r in t.to_pylist()}
    assert list(got) == [
        ("A", "planner"),
        ("A", "executor"),
        ("A", "all"),
        ("B", "planner"),
        ("B", "all"),
        ("C", "planner"),
        ("C", "all"),
    ]
    a = got[("A", "planner")]
    assert a["prompt_layout"] == "shared-first"
    assert a["weighted_hit_ratio"] == pytest.approx(1400 / 2000)
    assert a["cached_cross_agent_tokens"] == 500  # the one row that measured it
    assert a["first_divergence_previous_agent_mean"] == pytest.approx(800)
    assert a["max_reusable_tokens_mean"] == pytest.approx(850)
    whole = got[("A", "all")]
    assert whole["weighted_hit_ratio"] == pytest.approx(1400 / 2500)
    assert whole["recompute_burden"] == 200 + 400 + 500
    b = got[("B", "planner")]
    assert b["weighted_hit_ratio"] == pytest.approx(0.1)  # the failed call is out
    assert b["first_divergence_previous_agent_mean"] == pytest.approx(50)
    assert b["cached_cross_agent_tokens"] == 0  # measured 0 stays 0
    assert b["calls"] == 2 and b["failed"] == 1
    c = got[("C", "planner")]
    assert c["prompt_layout"] == "unknown"
    assert c["cached_cross_agent_tokens"] is None  # not measured: null
    assert c["first_divergence_previous_agent_mean"] is None


def test_no_runs() -> None:
    assert layout_comparison({}).num_rows == 0
