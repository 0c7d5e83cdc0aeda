"""LRU at many capacities in one compiled pass (caches/stack.py, stack_kernel.py) equals
simulating each capacity, field by field; what is not a stack is refused, with its reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sim_helpers import make_trace, random_trace

from kvscope.replaying import replay_document
from kvscope.sim.caches import compiled
from kvscope.sim.caches.pool import simulate_pool
from kvscope.sim.caches.result import SimResult
from kvscope.sim.caches.stack import lru_sweep
from kvscope.sim.inputs.sources import Source, load_source
from kvscope.sim.orders.base import LRUOrder
from kvscope.sim.plan import make_plan, run_cell, run_plan
from kvscope.sim.simulate import simulate, sweep_lru
from kvscope.sim.trace import Trace, prompt_only

FIXTURE = Path(__file__).parents[2] / "fixtures" / "replay" / "pathology"
FIELDS = ("policy", "capacity_blocks", "block_size", "cached_blocks", "host_blocks", "preempted")
FIELDS += ("harm_request", "harm_evictor", "harm_owner", "harm_blocks", "evictions")
FIELDS += ("prefetched_blocks", "engine", "caching", "in_request")
ORDERS = ["tail-first", "head-first"]


def sequential(trace: Trace, seed: int, whole: float = 0.0) -> Trace:
    """`trace` with requests one after another and no prompt of whole blocks but a `whole`
    share of them (a whole-block prompt's last block is recomputed even when cached: no stack
    then, at the capacities that still hold it)."""
    rng = np.random.default_rng(seed)
    bs = trace.block_size
    whole = rng.random(len(trace)) < whole
    part = np.where(whole, 0, rng.integers(1, bs, size=len(trace)))
    prompt = np.diff(trace.offsets) * bs + part
    return replace(trace, end_s=trace.start_s.copy(), prompt_tokens=prompt)


def assert_same(swept: SimResult, simulated: SimResult) -> None:
    for name in FIELDS:
        a, b = getattr(swept, name), getattr(simulated, name)
        assert np.array_equal(a, b), (name, swept.capacity_blocks)
        assert np.asarray(a).dtype == np.asarray(b).dtype, name
    assert swept.seconds >= 0


@pytest.mark.parametrize("whole", [0.0, 0.1])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("seed", range(8))
def test_one_pass_equals_each_capacity_simulated(seed: int, order: str, whole: float) -> None:
    """Random prefix trees played one request after another. Tail first every capacity a
    request fits in is a stack; head first a chain's head goes before its tail, which stays
    cached beyond the first miss (two copies) at the smaller capacities; a whole-block prompt
    recomputes its last block while cached. Whatever is answered equals the simulation, and
    what is not is refused."""
    trace = sequential(random_trace(seed, n=150), seed, whole)
    caps = [3, 8, 12, 20, 40, 80, 1000]
    found, why = sweep_lru(trace, caps, cache_outputs=False, in_request=order)
    assert set(found) | set(why) == set(caps) and not set(found) & set(why)
    assert "more than 3" in why[3]  # a request of 8 blocks does not fit in 3
    assert all("two copies" in why[c] for c in caps[1:] if c in why)
    if not whole:
        assert 1000 in found and (order == ORDERS[1] or len(found) == 6)
    for cap, result in found.items():
        simulated = simulate(trace, "lru", cap, cache_outputs=False, in_request=order)
        assert_same(result, simulated)
        assert result.evictions > 0 or cap >= 40
    owners = {c: set(r.harm_owner.tolist()) for c, r in found.items() if len(r.harm_owner)}
    assert owners or whole or order == ORDERS[1]


def chains(seed: int, n: int = 400, empty: bool = False, shared: int = 6) -> Trace:
    """Chains that never end in a whole block, sharing a first block and up to `shared` - 1
    more (tail first every capacity from the tightest is a stack; head first too where only
    the first block is shared); `empty`: one request in 8 has no full block."""
    rng = np.random.default_rng(seed)
    blocks = []
    for i in range(n):
        head = 1000 + int(rng.integers(0, 5))
        blocks.append([head] + [head * 100 + k for k in range(int(rng.integers(0, shared)))])
        blocks[-1] += [10**9 + i * 10 + k for k in range(int(rng.integers(1, 3)))]
        if empty and rng.random() < 0.125:
            blocks[-1] = []
    return make_trace(blocks)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("empty", [False, True])
def test_the_sweep_answers_the_generated_trace_at_every_capacity(order: str, empty: bool) -> None:
    trace = chains(3, empty=empty, shared=6 if order == ORDERS[0] else 1)
    caps = [8, 9, 12, 16, 24, 32, 64, 128, 4096]
    found, why = sweep_lru(trace, caps, cache_outputs=False, in_request=order)
    assert not why and sorted(found) == caps
    hits = [int(found[c].cached_blocks.sum()) for c in caps]
    assert hits == sorted(hits) and hits[0] < hits[-1]  # more capacity, more hits
    for cap in caps:
        pool = simulate_pool(prompt_only(trace), cap, LRUOrder(), head_first=order == ORDERS[1])
        assert_same(found[cap], replace(pool, caching="prompt-only", in_request=order))


def test_requests_taken_out_of_index_order() -> None:
    """Start times not in index order: the pass replays by time, harm rows sorted by index."""
    trace = chains(5, n=300)
    rng = np.random.default_rng(5)
    start = rng.permutation(len(trace)).astype(float)
    trace = replace(trace, start_s=start, end_s=start.copy())
    found, why = sweep_lru(trace, [8, 16, 32], cache_outputs=False)
    assert not why
    for cap, result in found.items():
        assert len(result.harm_request) and (np.diff(result.harm_request) >= 0).all()
        assert_same(result, simulate(trace, "lru", cap, cache_outputs=False))


def test_more_capacities_than_one_pass_counts() -> None:
    """Over 127 capacities: the pass runs in parts (a key's capacities are counted in int8)."""
    trace = chains(7, n=120)
    caps = list(range(8, 8 + 130))
    found, why = sweep_lru(trace, caps, cache_outputs=False)
    assert not why and sorted(found) == caps
    for cap in (8, 9, 60, 134, 135, 137):
        assert_same(found[cap], simulate(trace, "lru", cap, cache_outputs=False))


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
    found, why = sweep_lru(seq, [20], cache_outputs=True)  # output blocks take space
    assert not found and "output blocks" in why[20]
    found, why = sweep_lru(seq, [20], engine="sglang", cache_outputs=False)
    assert not found and "vLLM" in why[20]
    found, why = sweep_lru(seq, [20], host_blocks=8, cache_outputs=False)
    assert not found and "host tier" in why[20]
    with pytest.raises(ValueError, match="in-request"):
        sweep_lru(seq, [20], cache_outputs=False, in_request="sideways")
    found, why = sweep_lru(seq, [4, 20], cache_outputs=False)
    assert list(found) == [20] and "preempted" in why[4]
    repeated = make_trace([[1, 2, 1], [1, 2]])  # a key twice in one prompt
    found, why = sweep_lru(repeated, [4, 8], cache_outputs=False)
    assert not found and "repeats a key" in why[4] and "repeats a key" in why[8]
    whole = replace(make_trace([[1, 2], [1, 2]]), prompt_tokens=np.array([8, 8]))
    found, why = sweep_lru(whole, [4], cache_outputs=False)
    assert not found and "two copies" in why[4]  # its last block is recomputed while cached
    # two copies at a small capacity only: at 2 blocks the last [1, 2] misses 1, 2 is cached
    split = make_trace([[1, 2], [2], [3], [1, 2]])
    found, why = sweep_lru(split, [2, 3, 8], cache_outputs=False)
    assert "two copies" in why[2] and sorted(found) == [3, 8]
    for cap in found:
        assert_same(found[cap], simulate(split, "lru", cap, cache_outputs=False))
    keyless = replace(make_trace([[1], [2]]), prompt_tokens=np.array([9, 5]))
    found, why = lru_sweep(keyless, [4])  # not prompt_only's: takes blocks without a key
    assert not found and "without a prompt key" in why[4]


def _source(trace: Trace) -> Source:
    return Source("mooncake", trace)


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_plan_sweeps_lru_where_it_pays(jobs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = sequential(random_trace(5, n=150), 5)
    source = _source(trace)  # every capacity but 12 tokens (3 blocks) is a stack
    caps = ["32", "48", "80", "160", "4000", "12"]
    plan = make_plan(source, ["lru", "fifo"], caps, cache_outputs=False)
    alone = run_plan(source, plan, jobs=jobs)  # a small trace: cell by cell, as before
    assert not alone.notes
    monkeypatch.setattr(compiled, "COMPILED_FROM_BLOCKS", 1)  # as a large trace would
    done: list[tuple[str, int]] = []
    outcome = run_plan(source, plan, jobs=jobs, on_done=lambda p, c: done.append((p, c)))
    assert sorted(done) == sorted((p, int(c)) for p in ("lru", "fifo") for c in caps)
    assert [(s.policy, s.requested_capacity_tokens) for s in outcome.summaries] == [
        (p, int(c)) for p in ("lru", "fifo") for c in caps
    ]
    swept, simulated = outcome.notes
    assert "lru at 5 capacities (32, 48, 80, 160, 4,000 tokens): one pass" in swept
    assert "capacity by capacity at 12 tokens: a request needs 8 blocks" in simulated
    for mine, theirs in zip(outcome.summaries, alone.summaries, strict=True):
        a, b = mine.to_dict(), theirs.to_dict()
        a.pop("seconds"), b.pop("seconds")
        assert a == b
    for s in outcome.summaries[:6]:  # the summary (agents, harm pairs) equals the cell's own
        cell, _ = run_cell(source, plan, None, "lru", s.requested_capacity_tokens)
        a, b = s.to_dict(), cell.to_dict()
        a.pop("seconds"), b.pop("seconds")
        assert a == b


def test_run_plan_says_why_lru_was_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "COMPILED_FROM_BLOCKS", 1)
    source = _source(random_trace(2, n=80))  # overlapping requests
    outcome = run_plan(source, make_plan(source, ["lru"], ["40", "80"], cache_outputs=False))
    assert outcome.notes == [
        "lru simulated capacity by capacity at 40, 80 tokens: requests overlap in time "
        "(running requests pin blocks)"
    ]
    doc = replay_document(source, Path("trace.jsonl"), make_plan(source, ["lru"], ["40"]))
    assert doc["notes"][-1] == (  # the engine's caching keeps output blocks: not a stack
        "lru simulated capacity by capacity at 40 tokens: output blocks take cache space "
        "(--cache-outputs)"
    )
    seq = _source(sequential(random_trace(2, n=80), 2))
    tier = make_plan(seq, ["lru"], ["40", "80"], host_tokens=40, cache_outputs=False)
    assert not run_plan(seq, tier).notes  # a host tier: not tried
    plan = make_plan(seq, ["belady"], ["40", "80"], cache_outputs=False)
    assert not run_plan(seq, plan).notes  # no lru
