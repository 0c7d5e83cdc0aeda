"""An unmeasured value stays null through the analyses: each case the audit found, with its
null case (a counter with no known value, a harmful block with an unknown cost, failed rows,
sums over rows that have Level 3 provenance with their coverage)."""

import pyarrow as pa
import pytest

from kvscope.analysis import evictions
from kvscope.analysis.across_runs import layout_comparison
from kvscope.analysis.agents import recompute_burden, weighted_hit_ratio
from kvscope.analysis.provenance import by_agent
from kvscope.collect.series import series_deltas
from kvscope.records.blocks import BLOCKS_SCHEMA
from kvscope.records.requests import PROVENANCE_COLUMNS

NAN = float("nan")


def test_a_series_with_no_known_value_has_no_delta() -> None:
    rows = [
        {"timestamp_ns": 1, "name": "a", "value": NAN},
        {"timestamp_ns": 2, "name": "a", "value": NAN},
        {"timestamp_ns": 1, "name": "b", "value": 3.0},
        {"timestamp_ns": 2, "name": "b", "value": 3.0},
    ]
    assert series_deltas(rows, lambda r: r["name"]) == {"a": None, "b": 0.0}


def block(harmful: bool, recomputed: int | None, victim: str = "planner") -> dict:
    b = dict.fromkeys(BLOCKS_SCHEMA.names)
    return b | {
        "block_hash": id(b), "stored_ns": 0, "removed_ns": 5, "removal": "evicted",
        "owner_agent_id": victim, "evictor_agent_id": "executor", "harmful": harmful,
        "recomputed_tokens": recomputed, "needed_by_transition": "executor -> planner",
        "owner_workflow_run_id": "w", "evictor_workflow_run_id": "w", "residency_ms": 1.0,
    }  # fmt: skip


@pytest.mark.parametrize(("costs", "expected"), [((4, 8), 12), ((4, None), None)])
def test_recomputed_tokens_of_harmful_evictions(costs: tuple, expected: int | None) -> None:
    rows = [block(True, c) for c in costs] + [block(False, 0)]
    blocks = pa.Table.from_pylist(rows, schema=BLOCKS_SCHEMA)
    [cell] = evictions.matrix(blocks).to_pylist()
    assert (cell["harmful"], cell["recomputed_tokens"]) == (2, expected)
    [harm] = evictions.by_transition(blocks)
    assert (harm.harmful, harm.recomputed_tokens) == (2, expected)
    summary = evictions.summary(blocks)
    assert summary["recomputed_tokens"] == expected
    assert summary["harm.executor_to_planner.recomputed_tokens"] == expected


def test_no_harm_is_a_measured_zero_and_never_measured_is_null() -> None:
    for cost, expected in ((0, 0), (None, None)):
        blocks = pa.Table.from_pylist([block(False, cost)], schema=BLOCKS_SCHEMA)
        [cell] = evictions.matrix(blocks).to_pylist()
        assert cell["recomputed_tokens"] == expected
        assert evictions.summary(blocks)["recomputed_tokens"] == expected


def req(status: str, prompt: int | None, cached: int | None, **extra: object) -> dict:
    return {"status": status, "prompt_tokens": prompt, "cached_tokens": cached, **extra}


def test_cache_numbers_leave_out_failed_and_unmeasured_rows() -> None:
    rows = [
        req("ok", 100, 60),
        req("error", 900, 0),  # a failed call that still carries counts
        req("ok", 50, None),  # not measured
    ]
    assert weighted_hit_ratio(rows) == pytest.approx(0.6)
    assert recompute_burden(rows) == 40
    only_failed = [req("error", 100, 0), req("timeout", None, None)]
    assert weighted_hit_ratio(only_failed) is None and recompute_burden(only_failed) is None


def prov(agent: str, status: str, value: int | None) -> dict:
    return {"agent_id": agent, "status": status, **dict.fromkeys(PROVENANCE_COLUMNS, value)}


def test_per_agent_provenance_sums_say_how_many_calls_they_cover() -> None:
    rows = [
        prov("planner", "ok", 10),
        prov("planner", "ok", None),  # tokens not comparable: no provenance
        prov("planner", "error", 99),  # failed: not summed, not counted
        prov("executor", "ok", None),
    ]
    sums = by_agent(rows)
    assert set(sums) == {"planner"}  # the executor has nothing to sum: absent, not zeros
    assert (sums["planner"]["calls"], sums["planner"]["provenance_calls"]) == (2, 1)
    assert all(sums["planner"][c] == 10 for c in PROVENANCE_COLUMNS)


def test_cross_run_provenance_sum_comes_with_its_coverage() -> None:
    def table(values: list[int | None]) -> pa.Table:
        return pa.Table.from_pylist([
            {"agent_id": "a", "status": "ok", "prompt_tokens": 10, "cached_tokens": 5,
             "ttft_ms": 1.0, "cached_cross_agent_tokens": v,
             "first_divergence_previous_agent": None, "max_reusable_tokens": None}
            for v in values
        ])  # fmt: skip

    out = layout_comparison({"some": table([3, None, 4]), "none": table([None])}).to_pylist()
    got = {(r["run"], r["agent_id"]): r for r in out}
    assert (
        got[("some", "a")]["provenance_calls"],
        got[("some", "a")]["cached_cross_agent_tokens"],
    ) == (2, 7)
    assert (
        got[("none", "a")]["provenance_calls"],
        got[("none", "a")]["cached_cross_agent_tokens"],
    ) == (0, None)
