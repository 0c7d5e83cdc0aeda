"""Replay summaries (hit ratios per agent and transition, harm by agent pair, TTFT saved),
fidelity against the engine's measurements, and the choice of policies and capacities."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

from kvscope.errors import KvscopeError
from kvscope.sim import plan
from kvscope.sim.caches.result import SimResult
from kvscope.sim.inputs.sources import Source, load_source
from kvscope.sim.results.fidelity import NO_CAUSE, fidelity, nearest_start_gap, overlaps
from kvscope.sim.results.summary import NO_AGENT, UNKNOWN, summarize
from kvscope.sim.simulate import simulate
from kvscope.sim.trace import Trace

PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology"


def _trace(measured: list[float] | None) -> Trace:
    n = 3
    return Trace(
        source="hand",
        block_size=4,
        request_ids=("a", "b", "c"),
        start_s=np.array([0.0, 1.0, 2.0]),
        end_s=np.array([0.5, 1.5, 2.5]),
        prompt_tokens=np.array([8, 10, 6]),
        output_tokens=np.zeros(n, dtype=np.int64),
        keys=np.arange(5, dtype=np.uint64),
        offsets=np.array([0, 2, 4, 5]),
        agents=("x", "y", None),
        workflows=("w", "w", "w"),
        previous_agents=(None, "x", "y"),
        measured_cached_tokens=None if measured is None else np.array(measured),
    )


def _result(cached: list[int], harm: list[tuple[int, int, int, int]] = ()) -> SimResult:
    rows = np.array(harm, dtype=np.int64).reshape(-1, 4)
    return SimResult(
        policy="lru",
        capacity_blocks=10,
        block_size=4,
        cached_blocks=np.array(cached),
        host_blocks=np.zeros(3, dtype=np.int64),
        preempted=np.zeros(3, dtype=bool),
        harm_request=rows[:, 0],
        harm_evictor=rows[:, 1],
        harm_owner=rows[:, 2],
        harm_blocks=rows[:, 3],
        evictions=2,
        seconds=0.01,
    )


def test_summary_weights_by_tokens_per_agent_and_transition() -> None:
    s = summarize(_trace(None), _result([0, 1, 1], [(1, 2, 0, 1), (2, 1, 0, 1), (2, -1, 1, 1)]))
    assert (s.prompt_tokens, s.cached_tokens, s.recompute_tokens) == (24, 8, 16)
    assert s.hit_ratio == pytest.approx(8 / 24) and s.capacity_tokens == 40
    assert list(s.per_agent) == ["x", "y", NO_AGENT]
    assert s.per_agent["y"] == {"prompt_tokens": 10, "cached_tokens": 4}
    assert s.per_transition["start -> x"] == {"prompt_tokens": 8, "cached_tokens": 0}
    assert list(s.per_transition) == ["start -> x", "x -> y", NO_AGENT]
    assert s.harm == [
        {"evictor_agent": NO_AGENT, "victim_agent": "x", "blocks": 1, "tokens": 4},
        {"evictor_agent": UNKNOWN, "victim_agent": "y", "blocks": 1, "tokens": 4},
        {"evictor_agent": "y", "victim_agent": "x", "blocks": 1, "tokens": 4},
    ]
    assert s.ttft_saved_ms is None  # no fit, no measurements: null, not 0


def test_ttft_saved_counts_only_measured_requests() -> None:
    trace = _trace([0.0, math.nan, 0.0])
    s = summarize(trace, _result([1, 2, 1]), ms_per_token=0.5)
    assert s.ttft_saved_ms == pytest.approx(0.5 * (4 + 4))
    assert summarize(_trace([math.nan] * 3), _result([1, 2, 1]), 0.5).ttft_saved_ms is None


def test_overlaps_counts_requests_running_at_the_same_time() -> None:
    start, end = np.array([0.0, 1.0, 1.5, 5.0]), np.array([2.0, 3.0, 1.6, 6.0])
    assert list(overlaps(start, end)) == [2, 2, 2, 0]
    assert list(overlaps(np.array([0.0, 1.0]), np.array([1.0, 2.0]))) == [0, 0]  # back to back
    assert list(nearest_start_gap(np.array([5.0, 0.0, 1.0]))) == [4.0, 1.0, 1.0]


def test_fidelity_is_exact_at_the_engines_capacity_and_says_why_elsewhere() -> None:
    source = load_source(PATHOLOGY)
    # the run's own 27 usable blocks: every request's cached tokens as the engine measured them
    exact = fidelity(source, simulate(source.trace, "lru", 27))
    assert exact is not None and exact.exact_share == 1.0 and exact.weighted_difference == 0.0
    assert exact.meets_targets and exact.mismatches == []
    # a smaller cache than the engine's evicts more: the replay must disagree, with no cause found
    off = fidelity(source, simulate(source.trace, "lru", 16))
    assert off is not None and not off.meets_targets and off.exact < len(source.trace.request_ids)
    assert {tuple(m.reasons) for m in off.mismatches} == {(NO_CAUSE,)}
    assert off.to_dict()["causes"] == {NO_CAUSE.split(" (", 1)[0]: len(off.mismatches)}


def test_fidelity_names_preemption_timing_and_token_mismatch() -> None:
    trace = _trace([0.0, 4.0, 0.0])
    trace = Trace(**{**trace.__dict__, "end_s": np.array([1.2, 1.5, 2.5])})
    result = _result([0, 0, 1])
    result = SimResult(**{**result.__dict__, "preempted": np.array([False, False, True])})
    source = Source("run", trace, id_mismatch=np.array([False, False, True]))
    fid = fidelity(source, result)
    assert fid is not None and fid.exact == 1 and fid.weighted_difference == pytest.approx(2.0)
    reasons = {m.request_id: m.reasons for m in fid.mismatches}
    assert reasons["b"] == [
        "timing (overlapped 1 other requests in time; the nearest start 1000.0 ms apart)"
    ]
    assert reasons["c"][0].startswith("preempted") and "mismatched" in reasons["c"][1]


def test_policies_default_to_the_engines_own_and_skip_unregistered_ones(monkeypatch) -> None:
    source = load_source(PATHOLOGY)
    chosen, notes = plan.choose_policies([], source)
    assert chosen[0] == "lru"
    monkeypatch.setattr(plan, "POLICIES", ("lru", "belady", "fifo"))
    chosen, notes = plan.choose_policies([], source)
    assert chosen == ["lru", "belady"]
    assert notes == [
        f"policy {p!r} skipped: not in this simulator yet"
        for p in ("steps-to-execution", "predicted-next-agent")
    ]
    assert plan.choose_policies(["fifo", "lru", "fifo"], source)[0] == ["fifo", "lru"]
    with pytest.raises(KvscopeError, match="unknown policy 'nope'; known: lru, belady, fifo"):
        plan.choose_policies(["nope"], source)


def test_capacities_default_to_the_runs_and_parse_a_sweep() -> None:
    source = load_source(PATHOLOGY)
    assert plan.choose_capacities([], source) == [3456]
    assert plan.choose_capacities(["2048", "4_096", "2048"], source) == [2048, 4096]
    with pytest.raises(KvscopeError, match="integers"):
        plan.choose_capacities(["2k"], source)
    with pytest.raises(KvscopeError, match="less than one block"):
        plan.choose_capacities(["100"], source)
    made = plan.make_plan(source, ["lru"], ["3500"])
    assert made.notes[0] == (
        "capacity 3,500 tokens replayed as 27 whole blocks of 128 = 3,456 tokens "
        "(a cache holds whole blocks)"
    )
    (result,) = plan.run_plan(source, made).summaries
    assert (result.capacity_tokens, result.requested_capacity_tokens) == (3456, 3500)
    assert result.to_dict()["requested_capacity_tokens"] == 3500


def test_run_plan_replays_each_policy_and_capacity_and_the_fidelity_once() -> None:
    source = load_source(PATHOLOGY)
    out = plan.run_plan(source, plan.make_plan(source, ["lru"], ["2048", "3712"]))
    assert [s.capacity_tokens for s in out.summaries] == [2048, 3712]
    assert out.fidelity is not None and out.fidelity.capacity_tokens == 3456


def test_fidelity_names_calls_left_out_of_the_replay(tmp_path: Path) -> None:
    run = shutil.copytree(PATHOLOGY, tmp_path / "run")
    tokens = [json.loads(line) for line in (run / "prompt_tokens.jsonl").open()]
    del tokens[4]  # a call of the second cycle: its blocks only the engine had
    (run / "prompt_tokens.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tokens))
    source = load_source(run)
    assert source.excluded_start_s is not None and len(source.excluded_start_s) == 1
    fid = fidelity(source, simulate(source.trace, "lru", 29))
    assert fid is not None and fid.mismatches
    later = source.trace.start_s > source.excluded_start_s[0]
    for m in fid.mismatches:
        i = source.trace.request_ids.index(m.request_id)
        assert later[i] and any(r.startswith("left-out calls ran before it") for r in m.reasons)
