"""RQ4: reuse against KV capacity and concurrency; which agent loses reuse first."""

import pyarrow as pa
import pytest
from request_tables import request, table

from kvscope.analysis.across_runs import first_to_lose_reuse, pressure_sweep


def run(planner: float, executor: float) -> pa.Table:
    """One call per agent with 1000 prompt tokens and the given hit ratio."""
    return table(
        request(agent_id="planner", prompt_tokens=1000, cached_tokens=round(planner * 1000)),
        request(agent_id="executor", prompt_tokens=1000, cached_tokens=round(executor * 1000)),
    )


def capacity_sweep() -> pa.Table:
    return pressure_sweep(
        [
            ({"run": "c4k", "kv_capacity_tokens": 4000, "concurrency": 2}, run(0.75, 0.50)),
            ({"run": "c8k", "kv_capacity_tokens": 8000, "concurrency": 2}, run(0.80, 0.60)),
            ({"run": "c2k", "kv_capacity_tokens": 2000, "concurrency": 2}, run(0.50, 0.30)),
            # concurrency 4: only the planner drops (at 2000)
            ({"run": "c8k-4", "kv_capacity_tokens": 8000, "concurrency": 4}, run(0.80, 0.60)),
            ({"run": "c2k-4", "kv_capacity_tokens": 2000, "concurrency": 4}, run(0.40, 0.58)),
        ]
    )


def test_sweep_rows_are_ordered_by_pressure() -> None:
    t = capacity_sweep()
    head = t.slice(0, 9).select(["run", "kv_capacity_tokens", "concurrency", "agent_id"])
    assert head["run"].to_pylist()[::3] == ["c8k", "c4k", "c2k"]
    assert head["agent_id"].to_pylist()[:3] == ["planner", "executor", "all"]
    by = {(r["run"], r["agent_id"]): r for r in t.to_pylist()}
    assert by[("c4k", "executor")]["weighted_hit_ratio"] == pytest.approx(0.5)
    assert by[("c4k", "all")]["weighted_hit_ratio"] == pytest.approx(1250 / 2000)
    assert by[("c2k", "planner")]["recompute_burden"] == 500


def test_first_to_lose_reuse_by_capacity() -> None:
    first, second = first_to_lose_reuse(capacity_sweep())
    # concurrency 2: planner 0.80 -> 0.75 (>= 0.72, holds) -> 0.50; executor 0.60 -> 0.50 (< 0.54)
    assert (first.fixed, first.agent_id, first.at) == (2, "executor", 4000)
    assert (first.reference_at, first.reference_ratio) == (8000, pytest.approx(0.6))
    assert first.ratio == pytest.approx(0.5)
    assert first.axis == "kv_capacity_tokens"
    # concurrency 4: executor 0.60 -> 0.58 holds; planner 0.80 -> 0.40 drops at 2000
    assert (second.fixed, second.agent_id, second.at) == (4, "planner", 2000)


def test_tie_goes_to_the_larger_relative_drop_and_threshold_is_a_parameter() -> None:
    sweep = pressure_sweep(
        [
            ({"kv_capacity_tokens": 8000}, run(0.8, 0.6)),
            ({"kv_capacity_tokens": 4000}, run(0.7, 0.3)),  # both below 90%: executor drops more
        ]
    )
    (loss,) = first_to_lose_reuse(sweep)
    assert loss.agent_id == "executor" and loss.fixed is None
    (loss,) = first_to_lose_reuse(sweep, threshold=0.6)  # executor 0.3 < 0.36; planner holds
    assert loss.agent_id == "executor"
    assert first_to_lose_reuse(sweep, threshold=0.3) == []  # nobody fell that far


def test_concurrency_axis_and_agents_with_nothing_to_lose() -> None:
    sweep = pressure_sweep(
        [
            ({"concurrency": 1, "kv_capacity_tokens": 4096}, run(0.0, 0.9)),
            ({"concurrency": 8, "kv_capacity_tokens": 4096}, run(0.0, 0.7)),
        ]
    )
    (loss,) = first_to_lose_reuse(sweep, axis="concurrency")
    # the planner had 0 reuse at the least pressure: it has nothing to lose and is skipped
    assert (loss.agent_id, loss.at, loss.reference_at, loss.fixed) == ("executor", 8, 1, 4096)
    single = pressure_sweep([({"kv_capacity_tokens": 1}, run(0.5, 0.5))])
    assert first_to_lose_reuse(single) == []  # one point: no comparison


def test_groups_are_never_compared_and_repeats_are_pooled() -> None:
    sweep = pressure_sweep(
        [
            ({"kv_capacity_tokens": 8000, "group": "layout=shared-first"}, run(0.8, 0.6)),
            ({"kv_capacity_tokens": 2000, "group": "layout=shared-first"}, run(0.8, 0.3)),
            # role-first has a low planner at full capacity; against shared-first's 0.8 it would
            # look like a drop, but it is another group with a single point: no comparison
            ({"kv_capacity_tokens": 8000, "group": "layout=role-first"}, run(0.1, 0.1)),
            # a repeat of shared-first at 2000: pooled, executor (300 + 500) / 2000 = 0.4
            ({"kv_capacity_tokens": 2000, "group": "layout=shared-first"}, run(0.8, 0.5)),
        ]
    )
    assert sweep["group"].to_pylist()[:3] == ["layout=role-first"] * 3  # sorted within 8000
    (loss,) = first_to_lose_reuse(sweep)
    assert (loss.group, loss.agent_id, loss.at) == ("layout=shared-first", "executor", 2000)
    assert loss.ratio == pytest.approx(0.4)
