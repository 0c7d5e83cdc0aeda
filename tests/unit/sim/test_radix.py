"""The flat-slot radix cache (kvscope.sim.caches.radix) equals the node-tree reference oracle
(sim/radix_reference.py) on random traces: every policy, tight and loose capacities,
overlapping requests, outputs, priorities, requests shorter than a page, and prompts that join
the tree at their prefill end (overlapping other requests, ties). SGLang's node rules and its
insertion after prefill on hand-made traces, and the replay of three recorded SGLang runs
against what the engine measured."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from helpers import ROOT
from radix_reference import simulate_radix as reference
from sim_helpers import make_trace, random_trace

from kvscope.sim.caches.radix import RADIX_POLICIES, simulate_radix
from kvscope.sim.caches.result import SimResult
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.results.fidelity import fidelity
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


def _with_prefill_ends(tr: Trace, seed: int, grid: bool) -> Trace:
    """`tr` with prefill ends within each request's life: a fifth at the start, some NaN (at
    the start), some past the end (at the end). `grid`: starts, ends and prefill ends on a
    half-second grid, so that many coincide (fan-outs, a start at another's prefill end)."""
    rng = np.random.default_rng(seed)
    start, end = tr.start_s, tr.end_s
    if grid:
        start = np.floor(start * 2) / 2
        end = start + np.ceil((tr.end_s - tr.start_s) * 2) / 2
    frac = np.where(rng.random(len(tr)) < 0.2, 0.0, rng.uniform(0, 1, len(tr)))
    pe = start + frac * (end - start)
    if grid:
        pe = np.floor(pe * 2) / 2
    pe[rng.random(len(tr)) < 0.05] = np.nan
    pe[rng.random(len(tr)) < 0.05] += 10.0
    return replace(tr, start_s=start, end_s=end, prefill_end_s=pe)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("policy", RADIX_POLICIES)
def test_flat_radix_equals_the_reference(seed: int, policy: str) -> None:
    tr = random_trace(seed, n=200)
    flat = make_trace([list(tr.blocks_of(i)) for i in range(len(tr))])  # no overlap
    rng = np.random.default_rng(seed)
    prios = rng.integers(0, 3, len(tr)).astype(float).tolist() if policy == "priority" else None
    timed = [_with_prefill_ends(tr, seed, grid) for grid in (False, True)]
    short = _with_short_requests(tr, seed)
    for t in (tr, flat, short, *timed, replace(short, prefill_end_s=timed[0].prefill_end_s)):
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


def _shared_prefix(r2_start: float) -> Trace:
    # 4-token pages, prompts of n pages + 1 token, 1 output token: n + 1 pages each. r0 [1, 2]
    # leaves [1, 2] in the tree. r1 [1, 2, 3, 4, 5] starts at 1, its prefill ends at 3. r2
    # [1, 2, 3, 4, 6] shares r1's first 4 pages and starts at `r2_start`, its prefill ends at
    # 4.5. r3 (r2's prompt again) comes after both.
    tr = make_trace(
        [[1, 2], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 6]],
        start=[0, 1, r2_start, 8],
        end=[0.5, 6, 7, 9],
    )
    return replace(tr, prefill_end_s=np.array([0, 3, 4.5, 8]))


def test_a_prompt_joins_the_tree_at_its_prefill_end() -> None:
    # r2 starts at 2, before r1's prefill end: it matches only [1, 2] (cached before), not
    # r1's 3 and 4, and computes them itself (SGLang prefilled both in one batch)
    before = _both(_shared_prefix(2), "lru", 10)
    assert list(before.cached_blocks) == [0, 2, 2, 5]
    # r2 starting at r1's prefill end (3) or after matches them: 4 pages
    assert list(_both(_shared_prefix(3), "lru", 10).cached_blocks) == [0, 2, 4, 5]
    # r3 hits all 5 pages both ways: r2's duplicates of 3 and 4 were freed at its prefill end
    # (the tree already had them) and its 6 joined the tree under r1's 4
    assert before.evictions == 0
    # the pages are taken at the start: r1 holds 4 pages not in the tree (3, 4, 5, its partial
    # one) until 3, r2 4 more; in 9 pages with [1, 2] locked by both, r2 is short a page
    assert list(_both(_shared_prefix(2), "lru", 9).preempted) == [False, False, True, False]
    # from 3 on, r1's pages are in the tree: r2 takes 2 (6 and its partial page)
    assert not _both(_shared_prefix(3), "lru", 9).preempted.any()
    # without prefill timing a prompt joins the tree at its start (the rule before it)
    untimed = replace(_shared_prefix(2), prefill_end_s=None)
    assert list(_both(untimed, "lru", 10).cached_blocks) == [0, 2, 4, 5]


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
    # prompt after its prefill, so the engine found none of it. Inserting at the start, the
    # replay found 59 tokens (31 of 32 exact); at the prefill end (the first token), none.
    source = load_source(FIXTURES / "demo-sglang")
    tr = source.trace
    assert (tr.engine, tr.block_size, tr.capacity_tokens) == ("sglang", 1, 32768)
    fid = fidelity(source, simulate(tr, "lru", 32768, engine="sglang"))
    assert fid is not None and fid.exact == fid.compared == 32 and fid.meets_targets
    at_start = fidelity(source, simulate(_untimed(tr), "lru", 32768, engine="sglang"))
    assert at_start is not None
    assert [(m.measured, m.simulated) for m in at_start.mismatches] == [(0, 59)]


def _untimed(tr: Trace) -> Trace:
    return replace(tr, prefill_end_s=None)


def test_the_replay_matches_a_recorded_sglang_fan_out() -> None:
    # supervisor-sglang: 40 calls of 6 supervisor workflows two at a time, a 3,072-token pool
    # under LRU, page size 1. Its researchers' `Send` fan-outs start within a millisecond,
    # sharing a prefix, and SGLang prefills them in one batch (its log: "#new-seq: 3"): none
    # matches what the others compute. Inserting prompts at the start, the replay was 33 of
    # 40 exact, 15,099 cached tokens for 14,681 measured (weighted difference 2.85%: each
    # fanned-out researcher ~60 tokens too many); at the prefill end, every call is exact.
    source = load_source(FIXTURES / "supervisor-sglang")
    tr = source.trace
    assert (tr.engine, tr.block_size, tr.capacity_tokens, source.policy) == (
        "sglang",
        1,
        3072,
        "lru",
    )
    assert tr.prefill_end_s is not None and (tr.prefill_end_s > tr.start_s).all()
    fid = fidelity(source, simulate(tr, "lru", 3072, engine="sglang"))
    assert fid is not None and fid.compared == len(tr) == 40
    assert fid.exact == fid.compared and fid.meets_targets
    assert fid.simulated_tokens == fid.measured_tokens == 14681
    before = fidelity(source, simulate(_untimed(tr), "lru", 3072, engine="sglang"))
    assert before is not None and not before.meets_targets
    assert before.exact < fid.exact and before.simulated_tokens > fid.simulated_tokens
