"""Belady's next-use links (sim/orders/next_use.py) against the stable sort they replace."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import make_trace, random_trace

from kvscope.sim.caches.events import start_rank
from kvscope.sim.orders.next_use import NEVER, next_use
from kvscope.sim.trace import Trace


def sorted_next_use(trace: Trace, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The numpy reference: a stable sort by key of the positions in start order, each linked to
    its successor in its group."""
    counts = np.diff(trace.offsets)
    total = len(trace.keys)
    itype = np.int32 if total < 2**31 - 1 else np.int64
    by_rank = np.argsort(rank, kind="stable")
    c = counts[by_rank]  # flat positions, requests in start order
    pos = np.repeat((trace.offsets[:-1][by_rank] - (np.cumsum(c) - c)).astype(itype), c)
    pos += np.arange(total, dtype=itype)
    kp = trace.keys[pos]  # keys in start order
    o = np.argsort(kp, kind="stable")  # grouped by key, each group in start order
    ks = kp[o]
    del kp
    same = ks[1:] == ks[:-1]  # o[j + 1] is o[j]'s next use
    del ks
    s = pos[o]
    del pos
    nxt = np.full(total, -1, dtype=itype)
    nxt[s[:-1]] = np.where(same, s[1:], -1)
    del s, o, same
    # gathered along nxt, which mostly points a few requests ahead: cache-friendly
    nrank = np.where(nxt >= 0, np.repeat(rank, counts)[nxt], NEVER)
    return nxt, nrank


def _shuffled(seed: int) -> Trace:
    """Requests listed out of start order, prompts repeating keys, some with no keys."""
    rng = np.random.default_rng(seed)
    n = 200
    blocks = [rng.integers(0, 30, size=int(rng.integers(0, 12))).tolist() for _ in range(n)]
    start = rng.permutation(n).astype(float) / 3  # ties broken by index
    return make_trace(blocks, start=np.floor(start).tolist())


@pytest.mark.parametrize("seed", range(5))
def test_next_use_links_as_the_stable_sort_does(seed: int) -> None:
    for tr in (random_trace(seed), _shuffled(seed)):
        rank = start_rank(tr)
        nxt, nrank = next_use(tr, rank)
        ref_nxt, ref_nrank = sorted_next_use(tr, rank)
        assert nxt.dtype == ref_nxt.dtype
        assert nxt.tolist() == ref_nxt.tolist() and nrank.tolist() == ref_nrank.tolist()
        assert (nrank == NEVER).any() and (nxt >= 0).any()
