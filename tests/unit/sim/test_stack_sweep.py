"""LRU at many capacities in one pass (caches/stack.py) equals simulating each capacity."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sim_helpers import make_trace, random_trace

from kvscope.sim.caches.pool import simulate_pool
from kvscope.sim.caches.result import SimResult
from kvscope.sim.caches.stack import _count_rows
from kvscope.sim.inputs.sources import Source, load_source
from kvscope.sim.orders.base import LRUOrder
from kvscope.sim.plan import make_plan, run_cell, run_plan
from kvscope.sim.simulate import simulate, sweep_lru
from kvscope.sim.trace import Trace, prompt_only

FIXTURE = Path(__file__).parents[2] / "fixtures" / "replay" / "pathology"
FIELDS = ("cached_blocks", "host_blocks", "preempted", "evictions", "harm_request")
FIELDS += ("harm_evictor", "harm_owner", "harm_blocks", "caching", "in_request", "policy")


def sequential(trace: Trace, seed: int) -> Trace:
    """`trace` with requests one after another and no prompt of whole blocks but 1 in 10 (a
    whole-block prompt's last block is recomputed even when cached: no stack then)."""
    rng = np.random.default_rng(seed)
    bs = trace.block_size
    whole = rng.random(len(trace)) < 0.1
    part = np.where(whole, 0, rng.integers(1, bs, size=len(trace)))
    prompt = np.diff(trace.offsets) * bs + part
    return replace(trace, end_s=trace.start_s.copy(), prompt_tokens=prompt)


def assert_same(swept: SimResult, simulated: SimResult) -> None:
    for name in FIELDS:
        a, b = getattr(swept, name), getattr(simulated, name)
        assert np.array_equal(a, b), (name, swept.capacity_blocks)
    assert swept.method == "stack-distance" and simulated.method == "simulation"


@pytest.mark.parametrize("order", ["tail-first", "head-first"])
@pytest.mark.parametrize("seed", range(8))
def test_one_pass_equals_each_capacity_simulated(seed: int, order: str) -> None:
    trace = sequential(random_trace(seed, n=150), seed)
    caps = [3, 8, 12, 20, 40, 80, 1000]
    found, why = sweep_lru(trace, caps, cache_outputs=False, in_request=order)
    assert set(found) | set(why) == set(caps) and not set(found) & set(why)
    assert "more than 3" in why[3]  # a request of 8 blocks does not fit in 3
    for cap, result in found.items():
        simulated = simulate(trace, "lru", cap, cache_outputs=False, in_request=order)
        assert_same(result, simulated)
        assert result.evictions > 0 or cap >= 40


def test_the_sweep_answers_the_generated_trace_at_every_capacity() -> None:
    """Chains that never end in a whole block: every capacity from the tightest is a stack."""
    rng = np.random.default_rng(3)
    blocks = []
    for i in range(400):
        shared = [1000 + int(rng.integers(0, 5))]
        blocks.append(shared + [shared[0] * 100 + k for k in range(int(rng.integers(0, 6)))])
        blocks[-1] += [10**9 + i * 10 + k for k in range(int(rng.integers(1, 3)))]
    trace = make_trace(blocks)
    caps = [8, 9, 12, 16, 24, 32, 64, 128, 4096]
    found, why = sweep_lru(trace, caps, cache_outputs=False)
    assert not why and sorted(found) == caps
    hits = [int(found[c].cached_blocks.sum()) for c in caps]
    assert hits == sorted(hits) and hits[0] < hits[-1]  # more capacity, more hits
    for cap in caps:
        pool = simulate_pool(prompt_only(trace), cap, LRUOrder())
        assert np.array_equal(found[cap].cached_blocks, pool.cached_blocks)
        assert np.array_equal(found[cap].harm_blocks, pool.harm_blocks)
        assert np.array_equal(found[cap].harm_evictor, pool.harm_evictor)
        assert found[cap].evictions == pool.evictions


def test_on_the_pathology_fixture_played_one_call_after_another() -> None:
    source = load_source(FIXTURE)
    trace = replace(source.trace, end_s=source.trace.start_s.copy())
    caps = [8, 10, 16, 27, 64]
    found, why = sweep_lru(trace, caps, cache_outputs=False)
    assert found, why
    for cap, result in found.items():
        assert_same(result, simulate(trace, "lru", cap, cache_outputs=False))


def test_what_is_not_a_stack_is_left_to_the_simulation() -> None:
    trace = random_trace(1, n=60)  # overlapping requests: running requests pin blocks
    found, why = sweep_lru(trace, [20, 40], cache_outputs=False)
    assert not found and all("overlap" in w for w in why.values())
    seq = sequential(random_trace(1, n=60), 1)
    assert not sweep_lru(seq, [20], cache_outputs=True)[0]  # output blocks take space
    assert not sweep_lru(seq, [20], engine="sglang", cache_outputs=False)[0]
    repeated = make_trace([[1, 2, 1], [1, 2]])  # a key twice in one prompt
    found, why = sweep_lru(repeated, [4, 8], cache_outputs=False)
    assert not found and "repeats a key" in why[4]
    whole = replace(make_trace([[1, 2], [1, 2]]), prompt_tokens=np.array([8, 8]))
    found, why = sweep_lru(whole, [4], cache_outputs=False)
    assert not found and "two copies" in why[4]  # its last block is recomputed while cached


def _source(trace: Trace) -> Source:
    return Source("mooncake", trace)


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_plan_sweeps_lru_transparently(jobs: int) -> None:
    trace = sequential(random_trace(5, n=150), 5)
    source = _source(trace)
    caps = ["32", "48", "80", "160", "4000", "12"]
    plan = make_plan(source, ["lru", "fifo"], caps, cache_outputs=False)
    outcome = run_plan(source, plan, jobs=jobs)
    assert [(s.policy, s.requested_capacity_tokens) for s in outcome.summaries] == [
        (p, int(c)) for p in ("lru", "fifo") for c in caps
    ]
    methods = {s.requested_capacity_tokens: s.method for s in outcome.summaries[:6]}
    assert "stack-distance" in methods.values() and methods[12] == "simulation"
    assert any("one pass" in n for n in outcome.notes)
    assert any("capacity by capacity" in n for n in outcome.notes)
    for s in outcome.summaries[:6]:
        alone = simulate(trace, "lru", s.capacity_blocks, cache_outputs=False)
        assert int(alone.cached_tokens.sum()) == s.cached_tokens
        assert alone.evictions == s.evictions
    for s in outcome.summaries[:6]:  # the summary (agents, harm pairs) equals the cell's own
        alone, _ = run_cell(source, plan, None, "lru", s.requested_capacity_tokens)
        mine, theirs = s.to_dict(), alone.to_dict()
        assert theirs["method"] == "simulation"
        for d in (mine, theirs):
            d.pop("seconds"), d.pop("method")
        assert mine == theirs


def test_harm_rows_are_counted_the_same_packed_or_as_rows() -> None:
    rng = np.random.default_rng(0)
    req, evictor, owner = (rng.integers(0, 5, size=400) for _ in range(3))
    owner[:5] = -1
    packed = _count_rows(req, evictor, owner, n=1000)
    rows = _count_rows(req, evictor, owner, n=1 << 21)
    assert np.array_equal(packed[0], rows[0]) and np.array_equal(packed[1], rows[1])
    assert packed[1].sum() == 400 and len(packed[0]) < 400
