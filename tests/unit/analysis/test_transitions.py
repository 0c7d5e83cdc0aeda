"""RQ2: handoff and same-agent transitions, with gaps, shared prefixes and provenance."""

import pyarrow as pa
import pytest
from request_tables import MS, request, table

from kvscope.analysis.transitions import matrix, transitions


def call(wf: str, agent: str, prev: str | None, start: int, end: int, **kw: object) -> dict:
    return request(
        workflow_run_id=wf,
        agent_id=agent,
        previous_agent_id=prev,
        start_ns=start * MS,
        end_ns=end * MS,
        **kw,
    )


def two_workflows() -> pa.Table:
    provenance = dict(
        cached_self_tokens=0,
        cached_cross_agent_tokens=800,
        cached_cross_workflow_tokens=0,
        cached_unattributed_tokens=0,
        uncached_evicted_tokens=0,
        uncached_layout_tokens=100,
        uncached_cold_tokens=300,
    )
    return table(
        call("w0", "planner", None, 0, 100, turn_id=1, prompt_tokens=1000, cached_tokens=0),
        call(
            "w0",
            "executor",
            "planner",
            150,
            250,
            prompt_tokens=1200,
            cached_tokens=800,
            first_divergence_previous_agent=900,
            **provenance,
        ),
        call(
            "w0",
            "expresser",
            "executor",
            260,
            300,
            prompt_tokens=1000,
            cached_tokens=0,
            first_divergence_previous_agent=700,
        ),
        call("w0", "reviewer", "expresser", 300, 400, prompt_tokens=900),  # cached not measured
        call(
            "w0",
            "planner",
            "reviewer",
            500,
            600,
            turn_id=2,
            prompt_tokens=1500,
            cached_tokens=1000,
            first_divergence_previous_agent=400,
            first_divergence_same_agent=1000,
        ),
        call(
            "w0",
            "planner",
            "planner",
            650,
            700,
            turn_id=2,
            prompt_tokens=1600,
            cached_tokens=1500,
            first_divergence_previous_agent=1500,
            first_divergence_same_agent=1500,
        ),
        call("w1", "planner", None, 0, 50, prompt_tokens=1000, status="error"),
        call("w1", "executor", "planner", 80, 100, prompt_tokens=1000, cached_tokens=500),
    )


def pairs() -> dict[tuple[str, str, str], dict]:
    return {
        (r["kind"], r["from_agent"], r["to_agent"]): r
        for r in transitions(two_workflows()).to_pylist()
    }


def test_start_pair_counts_the_failed_call_but_not_in_the_ratio() -> None:
    start = pairs()[("handoff", "start", "planner")]
    assert (start["calls"], start["failed"], start["measured"]) == (2, 1, 1)
    assert start["weighted_hit_ratio"] == 0.0
    assert start["miss_share"] == 1.0
    assert start["miss_calls"] == 1
    assert start["recompute_burden"] == 1000
    assert start["gap_ms_p50"] is None
    assert start["shared_prefix_tokens"] is None  # not instrumented: null, not 0
    assert start["unserved_shared_prefix_tokens"] is None


def test_handoff_planner_to_executor() -> None:
    p = pairs()[("handoff", "planner", "executor")]
    assert p["calls"] == 2
    assert p["weighted_hit_ratio"] == pytest.approx(1300 / 2200)
    assert p["miss_share"] == pytest.approx(900 / 2200)
    assert p["recompute_burden"] == 400 + 500
    assert p["miss_calls"] == 0
    assert p["shared_prefix_tokens"] == 900  # w1's executor was not instrumented
    assert p["unserved_shared_prefix_tokens"] == 100  # shared 900, 800 served
    assert p["gap_ms_p50"] == pytest.approx((50 + 30) / 2)  # w1: gap after the failed planner
    assert p["provenance_calls"] == 1
    assert (p["cached_cross_agent_tokens"], p["uncached_layout_tokens"]) == (800, 100)
    assert p["uncached_cold_tokens"] == 300


def test_full_miss_unmeasured_and_loop_pairs() -> None:
    got = pairs()
    miss = got[("handoff", "executor", "expresser")]
    assert (miss["miss_calls"], miss["unserved_shared_prefix_tokens"]) == (1, 700)
    assert miss["gap_ms_p50"] == pytest.approx(10)
    unmeasured = got[("handoff", "expresser", "reviewer")]
    assert unmeasured["calls"] == 1 and unmeasured["measured"] == 0
    assert unmeasured["weighted_hit_ratio"] is None and unmeasured["miss_share"] is None
    assert unmeasured["cached_self_tokens"] is None  # provenance not measured
    back = got[("handoff", "reviewer", "planner")]
    assert back["weighted_hit_ratio"] == pytest.approx(1000 / 1500)
    assert back["unserved_shared_prefix_tokens"] == 0  # shared 400, 1000 served
    again = got[("handoff", "planner", "planner")]
    assert again["weighted_hit_ratio"] == pytest.approx(1500 / 1600)
    assert again["gap_ms_p50"] == pytest.approx(50)


def test_same_agent_returns() -> None:
    got = pairs()
    same = {k: v for k, v in got.items() if k[0] == "same-agent"}
    assert list(same) == [("same-agent", "planner", "planner")]  # others run once per workflow
    p = same[("same-agent", "planner", "planner")]
    assert p["calls"] == 2  # turn 2's two planner calls, each back after the previous one
    assert p["weighted_hit_ratio"] == pytest.approx(2500 / 3100)
    assert p["recompute_burden"] == 600
    assert p["shared_prefix_tokens"] == 2500
    assert p["gap_ms_p50"] == pytest.approx((400 + 50) / 2)


def test_order_and_heatmap_matrix() -> None:
    t = transitions(two_workflows())
    assert t["kind"].to_pylist()[0] == "handoff" and t["from_agent"].to_pylist()[0] == "start"
    froms, tos, cells = matrix(t)
    assert froms == ["start", "planner", "executor", "expresser", "reviewer"]
    assert tos == ["planner", "executor", "expresser", "reviewer"]
    assert cells[0] == [0.0, None, None, None]
    assert cells[1][1] == pytest.approx(1300 / 2200)
    assert cells[3][3] is None  # expresser -> reviewer happened, but was not measured


def test_empty_table() -> None:
    assert transitions(table()).num_rows == 0


def test_eviction_pairs() -> None:
    from kvscope.analysis.evictions import matrix as eviction_pairs

    blocks = pa.table(
        {
            "block_hash": [1, 2, 3, 4, 5, 6],
            "owner_agent_id": ["planner", "planner", "executor", None, "planner", "planner"],
            "owner_workflow_run_id": ["w0", "w1", "w0", "w0", "w0", "w0"],
            "evictor_agent_id": ["executor", "executor", None, "planner", "executor", "reviewer"],
            "evictor_workflow_run_id": ["w0", "w0", None, "w1", "w0", "w0"],
            "harmful": [True, False, True, False, True, False],
            "recomputed_tokens": [16, 0, 32, None, 16, None],
            "residency_ms": [10.0, 20.0, 30.0, 5.0, 40.0, 1.0],
            "removed_ns": [1, 2, 3, 4, None, 6],  # block 5 was never removed
            "removal": ["evicted", "evicted", "evicted", "evicted", None, "freed"],
        }
    )
    got = {
        (r["evictor_agent_id"], r["victim_agent_id"]): r
        for r in eviction_pairs(blocks, ["planner", "executor"]).to_pylist()
    }
    assert list(got) == [("planner", "unknown"), ("executor", "planner"), ("unknown", "executor")]
    p = got[("executor", "planner")]
    assert (p["evictions"], p["same_workflow"], p["harmful"]) == (2, 1, 1)
    assert p["recomputed_tokens"] == 16  # block 5 (not removed) and block 6 (freed) are out
    assert p["residency_ms_p50"] == pytest.approx(15)
    assert got[("unknown", "executor")]["recomputed_tokens"] == 32
    assert got[("planner", "unknown")]["harmful"] == 0
    assert got[("planner", "unknown")]["recomputed_tokens"] is None  # never measured
