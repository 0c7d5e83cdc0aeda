"""The flat-slot radix cache (kvscope.sim.caches.radix) equals the node-tree reference oracle
(sim/radix_reference.py) on random traces: every policy, tight and loose capacities,
overlapping requests, outputs, priorities, and requests shorter than a page. SGLang's node
rules on hand-made traces, and the replay of two recorded SGLang runs against what the engine
measured."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import ROOT
from radix_reference import simulate_radix as reference
from sim_helpers import make_trace, random_trace

from kvscope.sim.caches.radix import RADIX_POLICIES, simulate_radix
from kvscope.sim.caches.result import SimResult
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.results.fidelity import DIFF_TARGET, fidelity
from kvscope.sim.simulate import simulate
from kvscope.sim.trace import Trace

FIXTURES = ROOT / "tests" / "fixtures" / "replay"


def _same(a: SimResult, b: SimResult) -> None:
    assert list(a.cached_blocks) == list(b.cached_blocks)
    assert list(a.preempted) == list(b.preempted)
    assert a.evictions == b.evictions
    for f in ("harm_request", "harm_evictor", "harm_owner", "harm_blocks"):
        assert list(getattr(a, f)) == list(getattr(b, f)), f


def _with_short_requests(tr: Trace, seed: int) -> Trace:
    """`tr` with every 7th request's prompt cut below one page (no keys), output kept."""
    rng = np.random.default_rng(seed)
    chains = [list(tr.blocks_of(i)) if i % 7 else [] for i in range(len(tr))]
    short = make_trace(chains, start=list(tr.start_s), end=list(tr.end_s), block_size=4)
    prompt = np.where(np.arange(len(tr)) % 7, tr.prompt_tokens, rng.integers(1, 4, len(tr)))
    return Trace(**{**short.__dict__, "prompt_tokens": prompt, "output_tokens": tr.output_tokens})


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("policy", RADIX_POLICIES)
def test_flat_radix_equals_the_reference(seed: int, policy: str) -> None:
    tr = random_trace(seed, n=200)
    flat = make_trace([list(tr.blocks_of(i)) for i in range(len(tr))])  # no overlap
    rng = np.random.default_rng(seed)
    prios = rng.integers(0, 3, len(tr)).astype(float).tolist() if policy == "priority" else None
    for t in (tr, flat, _with_short_requests(tr, seed)):
        for cap in (0, 3, 8, 20, 60, 10_000):
            got = simulate_radix(t, policy, cap, prios)
            _same(got, reference(t, policy, cap, prios))
            assert got.engine == "sglang"


def _both(tr: Trace, policy: str, cap: int) -> SimResult:
    got = simulate_radix(tr, policy, cap)
    _same(got, reference(tr, policy, cap))
    return got


def test_a_leaf_node_is_evicted_whole() -> None:
    # 4-token pages, prompts of n pages + 1 token, 1 output token: n + 1 pages each, n cached
    # after. 6 pages. r0 inserts [1, 2, 3]: one node A (3 pages). r1 [4]: node B, 2 free.
    # r2 [5, 6] needs 3 pages: one short. The leaves are A (last used at r0) and B (r1): LRU
    # takes A, and SGLang frees a node's whole value: all 3 pages, not just page 3 as a
    # page-by-page cache would (which keeps 1, 2 and so hits 2 pages at r3). r3 [1, 2]: 0.
    r = _both(make_trace([[1, 2, 3], [4], [5, 6], [1, 2]]), "lru", 6)
    assert list(r.cached_blocks) == [0, 0, 0, 0]
    assert r.evictions == 3  # pages; the page-by-page cache evicts 1
    assert list(r.harm_blocks) == [2]  # r3 recomputes 1 and 2, evicted by r2


def test_a_match_that_ends_inside_a_node_splits_it() -> None:
    # 6 pages. r0 inserts A = [1, 2, 3]. r1 [1, 2, 9] matches 2 pages: SGLang splits A into
    # [1, 2] and [3] (touched by the split) and inserts [9] under [1, 2]. r2 [5, 6] needs 3
    # pages with 2 free: the leaves are [3] (touched at r1's start) and [9] (r1's end touches
    # its whole path): [3] goes, 1 page; [1, 2] has a child, so it stays. r3 [1, 2, 3] hits 2
    # and needs 2 more with 1 free: it evicts [9] (older than r2's [5, 6]).
    r = _both(make_trace([[1, 2, 3], [1, 2, 9], [5, 6], [1, 2, 3]]), "lru", 6)
    assert list(r.cached_blocks) == [0, 2, 0, 2]
    assert r.evictions == 2


def test_a_finished_prompt_outranks_its_output_under_priority() -> None:
    # 8 output tokens: a 1-page prompt takes 3 pages and leaves a 2-page output node. All
    # priorities equal (0), but SGLang re-inserts a finished request's prompt at priority + 1:
    # outputs go first. 8 pages. r0 [1] -> A + O0, r1 [2] -> B + O1 (6 pages). r2 [3] needs 3
    # with 2 free: O0 (priority 0, older than O1) goes. r3 [4] needs 3 with 1 free: O1, O2
    # (priority 0) before A (1): O1 goes. r4 [1] hits A: 1 page; it evicts O2 (2 pages).
    # LRU instead evicts A at r3 (older than O1), so r4 misses.
    tr = make_trace([[1], [2], [3], [4], [1]], output=8)
    r = _both(tr, "priority", 8)
    assert list(r.cached_blocks) == [0, 0, 0, 0, 1]
    assert r.evictions == 6
    assert list(_both(tr, "lru", 8).cached_blocks) == [0, 0, 0, 0, 0]


def test_the_replay_matches_recorded_sglang_runs_under_lru() -> None:
    # pathology-sglang: 12 calls in a 3,072-token pool, page size 1; every agent's 937-token
    # prompt was evicted whole (one node) before its next call, 3 tokens (the chat template's
    # start, a node of its own) cached
    source = load_source(FIXTURES / "pathology-sglang")
    tr = source.trace
    assert (tr.engine, tr.block_size, tr.capacity_tokens) == ("sglang", 1, 3072)
    assert source.policy == "lru"
    r = simulate(tr, "lru", 3072, engine="sglang")
    fid = fidelity(source, r)
    assert fid is not None and fid.compared == fid.exact == 12
    assert fid.measured_tokens == fid.simulated_tokens == 33
    removed = sum(
        len(e["block_hashes"])
        for line in (FIXTURES / "pathology-sglang" / "kv_events.jsonl").open()
        for e in json.loads(line)["events"]
        if e["kind"] == "removed"
    )
    assert r.evictions == removed - 1 == 8541  # the engine also evicted its 1-token warm-up
    # demo-sglang: 32 calls of 4 workflows two at a time, no eviction. One call began 16 ms
    # after another sharing its first 59 tokens, both prefilled together: SGLang inserts a
    # prompt after its prefill, so the engine found none of it; the replay (inserting at the
    # start) finds 59 tokens.
    source = load_source(FIXTURES / "demo-sglang")
    tr = source.trace
    assert (tr.engine, tr.block_size, tr.capacity_tokens) == ("sglang", 1, 32768)
    fid = fidelity(source, simulate(tr, "lru", 32768, engine="sglang"))
    assert fid is not None and fid.exact == fid.compared - 1 == 31
    assert fid.weighted_difference is not None and fid.weighted_difference <= DIFF_TARGET
    assert [(m.measured, m.simulated) for m in fid.mismatches] == [(0, 59)]
