"""RQ1: per agent and per agent x turn, on the design note's worked examples."""

import pyarrow as pa
import pytest
from request_tables import request, table

from kvscope.analysis.turns import agent_summary, agent_turns
from kvscope.records.requests import RequestRecord


def design_note_runs() -> pa.Table:
    return table(
        # "Workflow-level weighted hit ratio": 100/90 and 10000/1000, both planner turn 1.
        request(agent_id="planner", turn_id=1, prompt_tokens=100, cached_tokens=90, ttft_ms=10.0),
        request(
            agent_id="planner", turn_id=1, prompt_tokens=10_000, cached_tokens=1000, ttft_ms=30.0
        ),
        # not measured: counted as a call, left out of the ratio and the burden (not as 0)
        request(agent_id="planner", turn_id=1, prompt_tokens=500, cached_tokens=None, ttft_ms=20.0),
        # failed: counted as a call and as failed, left out of ratio, burden and TTFT
        request(
            agent_id="planner",
            turn_id=1,
            prompt_tokens=800,
            cached_tokens=0,
            ttft_ms=9999.0,
            status="error",
        ),
        # "Recompute burden": one call per agent, turn 2
        request(agent_id="planner", turn_id=2, prompt_tokens=4000, cached_tokens=3000),
        request(agent_id="executor", turn_id=2, prompt_tokens=8000, cached_tokens=2000),
        request(agent_id="expresser", turn_id=2, prompt_tokens=5000, cached_tokens=4500),
        request(agent_id="reviewer", turn_id=2, prompt_tokens=3000, cached_tokens=1000),
    )


def by_key(t: pa.Table, *keys: str) -> dict[tuple, dict]:
    return {tuple(r[k] for k in keys): r for r in t.to_pylist()}


def test_agent_turns_weighted_ratio_and_burden() -> None:
    got = by_key(agent_turns(design_note_runs()), "agent_id", "turn_id")
    p1 = got[("planner", 1)]
    assert (p1["calls"], p1["failed"], p1["measured"]) == (4, 1, 2)
    assert (p1["prompt_tokens"], p1["cached_tokens"]) == (10_100, 1090)
    assert p1["weighted_hit_ratio"] == pytest.approx(1090 / 10_100)  # 10.8%, not the 50% mean
    assert round(p1["weighted_hit_ratio"], 3) == 0.108
    assert p1["recompute_burden"] == 10 + 9000
    assert p1["ttft_p50_ms"] == pytest.approx(20.0)  # median of 10, 20, 30; the failed 9999 out
    burdens = {
        a: got[(a, 2)]["recompute_burden"] for a in ("planner", "executor", "expresser", "reviewer")
    }
    assert burdens == {"planner": 1000, "executor": 6000, "expresser": 500, "reviewer": 2000}
    assert sum(burdens.values()) == 9500
    assert got[("executor", 2)]["ttft_p50_ms"] is None  # no TTFT measured: null, not 0


def test_agent_turns_order_is_peer_then_turn() -> None:
    t = agent_turns(design_note_runs())
    keys = list(zip(t["agent_id"].to_pylist(), t["turn_id"].to_pylist(), strict=True))
    assert keys == [
        ("planner", 1),
        ("planner", 2),
        ("executor", 2),
        ("expresser", 2),
        ("reviewer", 2),
    ]


def test_a_group_with_nothing_measured_has_null_ratio_and_burden() -> None:
    t = table(request(agent_id="executor", prompt_tokens=700), request(agent_id="executor"))
    (row,) = agent_turns(t).to_pylist()
    assert row["calls"] == 2 and row["measured"] == 0
    assert row["weighted_hit_ratio"] is None
    assert row["recompute_burden"] is None
    assert row["prompt_tokens"] is None


def test_agent_summary_reuses_per_agent() -> None:
    got = by_key(agent_summary(design_note_runs()), "agent_id")
    planner = got[("planner",)]
    assert planner["calls"] == 5 and planner["failed"] == 1
    assert planner["cached_tokens"] == 90 + 1000 + 3000
    assert planner["weighted_hit_ratio"] == pytest.approx(4090 / 14_100)
    assert planner["new_prefill_tokens"] == 10 + 9000 + 1000
    assert list(got) == [("planner",), ("executor",), ("expresser",), ("reviewer",)]


def test_empty_table_and_older_runs_without_new_columns() -> None:
    assert agent_turns(table()).num_rows == 0
    assert agent_summary(table()).num_rows == 0
    old = design_note_runs().drop_columns(["cached_self_tokens", "max_reusable_tokens"])
    added = RequestRecord.conform(old)
    assert added.column_names[-2:] == ["max_reusable_tokens", "cached_self_tokens"]
    assert added["cached_self_tokens"].null_count == old.num_rows
    assert agent_turns(old).num_rows == 5
