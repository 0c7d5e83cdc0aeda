"""The flat-slot radix cache (kvscope.replay.radix) equals the node-dict reference oracle
(replay_radix_reference.py) on random traces: every policy, tight and loose capacities,
overlapping requests, outputs, priorities, and requests shorter than a page."""

from __future__ import annotations

import numpy as np
import pytest
from replay_radix_reference import simulate_radix as reference
from replay_sim_helpers import make_trace, random_trace

from kvscope.replay.radix import RADIX_POLICIES, simulate_radix
from kvscope.replay.result import SimResult
from kvscope.replay.trace import Trace


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
