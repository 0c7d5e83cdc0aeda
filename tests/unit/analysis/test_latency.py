"""RQ6: workflow time along the critical path, per agent, and the cache-miss cost fit."""

import pyarrow as pa
import pytest
from request_tables import MS, request, table

from kvscope.analysis.latency import (
    PrefillFit,
    agent_breakdown,
    call_rows,
    fit_prefill_cost,
    workflow_breakdown,
)


def workflow() -> pa.Table:
    """One sequential PEER cycle: 0-1000, 1100-1600 (tool 40), 1700-1900 failed, 2000-2300."""
    return table(
        # engine gave queue, prefill and decode: call_other = 1000 - 10 - 190 - 780 = 20
        request(
            agent_id="planner",
            start_ns=0,
            end_ns=1000 * MS,
            queue_ms=10.0,
            prefill_ms=190.0,
            ttft_ms=210.0,
            decode_ms=780.0,
            e2e_ms=1000.0,
            prompt_tokens=1000,
            cached_tokens=0,
        ),
        # client only: TTFT not split (100), decode = e2e - ttft = 400; gap 100 - tool 40 = 60
        request(
            agent_id="executor",
            start_ns=1100 * MS,
            end_ns=1600 * MS,
            tool_ms=40.0,
            ttft_ms=100.0,
            e2e_ms=500.0,
            prompt_tokens=600,
            cached_tokens=200,
        ),
        request(
            agent_id="expresser",
            start_ns=1700 * MS,
            end_ns=1900 * MS,
            status="error",
            prompt_tokens=700,
        ),
        # queue known, prefill = ttft - queue = 50, decode = 300 - 50
        request(
            agent_id="reviewer",
            start_ns=2000 * MS,
            end_ns=2300 * MS,
            queue_ms=0.0,
            ttft_ms=50.0,
            e2e_ms=300.0,
            prompt_tokens=300,
            cached_tokens=300,
        ),
    )


def test_call_components() -> None:
    rows = {r["agent_id"]: r for r in call_rows(workflow()).to_pylist()}
    p, e, x, r = (rows[a] for a in ("planner", "executor", "expresser", "reviewer"))
    assert (p["queue_ms"], p["prefill_ms"], p["decode_ms"]) == (10, 190, 780)
    assert p["ttft_unsplit_ms"] is None and p["call_other_ms"] == pytest.approx(20)
    assert p["other_ms"] is None  # first call: no gap before it
    assert e["queue_ms"] is None and e["prefill_ms"] is None  # not measured stays null
    assert e["ttft_unsplit_ms"] == pytest.approx(100)
    assert e["decode_ms"] == pytest.approx(400)
    assert e["other_ms"] == pytest.approx(60)
    assert x["failed_ms"] == pytest.approx(200) and x["call_ms"] is None
    assert x["decode_ms"] is None and x["new_prefill"] is None
    assert (r["prefill_ms"], r["decode_ms"], r["other_ms"]) == (50, 250, 100)
    assert all(v is None for v in call_rows(workflow())["cache_miss_ms"].to_pylist())


def test_workflow_critical_path_adds_up_to_the_wall_time() -> None:
    (w,) = workflow_breakdown(workflow()).to_pylist()
    assert w["calls"] == 4 and w["failed"] == 1
    assert w["call_ms"] == pytest.approx(1000 + 500 + 300)
    assert (w["failed_ms"], w["tool_ms"], w["other_ms"]) == pytest.approx((200, 40, 260))
    assert w["path_ms"] == pytest.approx(2300)
    assert w["critical_path_ms"] == pytest.approx(2300)  # sequential: every call is on it
    assert w["wall_ms"] == pytest.approx(2300)
    assert w["slowest_agent"] == "planner"
    assert w["queue_ms"] == pytest.approx(10)  # the executor's unknown queue is not a 0 here
    assert w["cache_miss_ms"] is None and w["cache_miss_calls"] == 0


def fan_out() -> pa.Table:
    """A supervisor 0-100 sends three branches (110-400, 110-900, 120-300); a join 950-1000."""
    spans = {
        "supervisor": (0, 100),
        "a": (110, 400),
        "b": (110, 900),
        "c": (120, 300),
        "join": (950, 1000),
    }
    return table(
        *(
            request(agent_id=a, start_ns=s * MS, end_ns=e * MS, e2e_ms=float(e - s))
            for a, (s, e) in spans.items()
        )
    )


def test_the_critical_path_goes_through_the_slowest_branch() -> None:
    rows = {r["agent_id"]: r["critical"] for r in call_rows(fan_out()).to_pylist()}
    assert rows == {"supervisor": True, "a": False, "b": True, "c": False, "join": True}
    (w,) = workflow_breakdown(fan_out()).to_pylist()
    # calls 100 + 290 + 790 + 180 + 50; gaps: each branch from the supervisor's end (10, 10,
    # 20), the join from b's end (50)
    assert w["path_ms"] == pytest.approx(1410 + 90)
    assert w["critical_path_ms"] == pytest.approx(100 + 10 + 790 + 50 + 50)  # = wall time
    assert w["wall_ms"] == pytest.approx(1000)
    agents = {r["agent_id"]: r for r in agent_breakdown(fan_out()).to_pylist()}
    assert agents["a"]["critical_path_ms"] == 0 and agents["a"]["path_ms"] == pytest.approx(300)
    assert agents["b"]["critical_path_ms"] == pytest.approx(800)


def test_agent_shares_and_flags() -> None:
    got = {r["agent_id"]: r for r in agent_breakdown(workflow()).to_pylist()}
    paths = {a: got[a]["path_ms"] for a in got}
    assert paths == pytest.approx(
        {"planner": 1000, "executor": 600, "expresser": 300, "reviewer": 400}
    )
    assert got["executor"]["share"] == pytest.approx(600 / 2300)
    assert sum(r["share"] for r in got.values()) == pytest.approx(1)
    assert got["executor"]["weighted_hit_ratio"] == pytest.approx(200 / 600)
    assert got["planner"]["flag"] == "low hit, large share"  # hit 0, share 43%
    assert got["expresser"]["flag"] == ""  # nothing measured: no verdict
    assert got["reviewer"]["flag"] == ""  # hit 100%
    small = {
        r["agent_id"]: r["flag"] for r in agent_breakdown(workflow(), small_share=0.3).to_pylist()
    }
    assert small["executor"] == "low hit, small share"  # hit 33%, share 26% < 30%


def fit_rows() -> pa.Table:
    # prefill = 100 + 0.5 * new_prefill_tokens, exactly
    return table(
        request(prompt_tokens=200, cached_tokens=200, prefill_ms=100.0, start_ns=0),
        request(prompt_tokens=400, cached_tokens=200, prefill_ms=200.0, start_ns=1),
        request(
            prompt_tokens=1500,
            cached_tokens=500,
            prefill_ms=600.0,
            start_ns=2,
            uncached_evicted_tokens=100,
            uncached_layout_tokens=60,
        ),
        request(
            prompt_tokens=900,
            cached_tokens=0,
            prefill_ms=9000.0,
            start_ns=3,
            status="error",
            uncached_evicted_tokens=100,
        ),
    )


def test_prefill_cost_fit_and_cache_miss_cost() -> None:
    fit = fit_prefill_cost(fit_rows())
    assert fit is not None
    assert (fit.intercept_ms, fit.ms_per_token) == pytest.approx((100, 0.5))
    assert fit.r2 == pytest.approx(1) and fit.rows == 3 and fit.fit_on == "prefill_ms"
    miss = call_rows(fit_rows(), fit)["cache_miss_ms"].to_pylist()
    assert miss == [None, None, pytest.approx(0.5 * 160), None]  # layout unknown on the last
    (agent,) = agent_breakdown(fit_rows(), fit).to_pylist()
    assert agent["cache_miss_ms"] == pytest.approx(80) and agent["cache_miss_calls"] == 1


def test_fit_falls_back_to_ttft_and_needs_three_rows() -> None:
    fit = fit_prefill_cost(workflow())  # prefill known on 2 rows only: fit TTFT on 3
    assert fit is not None and fit.fit_on == "ttft_ms" and fit.rows == 3
    xs, ys = [1000, 400, 0], [210.0, 100.0, 50.0]
    mx, my = sum(xs) / 3, sum(ys) / 3
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    assert fit.ms_per_token == pytest.approx(slope)
    assert fit.intercept_ms == pytest.approx(my - slope * mx)
    assert fit_prefill_cost(fit_rows().slice(0, 2)) is None
    same_x = table(
        *(
            request(prompt_tokens=10, cached_tokens=0, prefill_ms=float(i), start_ns=i)
            for i in range(3)
        )
    )
    assert fit_prefill_cost(same_x) is None  # no spread in tokens: no slope


def test_a_fit_whose_time_falls_with_the_tokens_is_none() -> None:
    """TTFT shrinking as prompts grow (queueing noise) is no prefill cost: no negative savings."""
    falling = table(
        *(
            request(prompt_tokens=p, cached_tokens=0, ttft_ms=t, start_ns=i)
            for i, (p, t) in enumerate([(100, 400.0), (500, 300.0), (900, 150.0)])
        )
    )
    assert fit_prefill_cost(falling) is None
    flat = table(
        *(
            request(prompt_tokens=p, cached_tokens=0, prefill_ms=50.0, start_ns=i)
            for i, p in enumerate([100, 500, 900])
        )
    )
    assert fit_prefill_cost(flat) is None  # zero ms per token


def test_cost_without_a_fit_is_null() -> None:
    fit = PrefillFit(0.0, 2.0, None, 3, "prefill_ms")
    assert call_rows(fit_rows(), None)["cache_miss_ms"].null_count == 4
    assert call_rows(fit_rows(), fit)["cache_miss_ms"].to_pylist()[2] == pytest.approx(320)
