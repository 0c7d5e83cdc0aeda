"""Belady's next-use links (sim/orders/next_use.py) against the stable sort they replace."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import make_trace, random_trace

from kvscope.sim.caches.events import start_rank
from kvscope.sim.orders import next_use as nu
from kvscope.sim.orders.next_use import NEVER, sorted_next_use
from kvscope.sim.trace import Trace


def _shuffled(seed: int) -> Trace:
    """Requests listed out of start order, prompts repeating keys, some with no keys."""
    rng = np.random.default_rng(seed)
    n = 200
    blocks = [rng.integers(0, 30, size=int(rng.integers(0, 12))).tolist() for _ in range(n)]
    start = rng.permutation(n).astype(float) / 3  # ties broken by index
    return make_trace(blocks, start=np.floor(start).tolist())


@pytest.mark.parametrize("seed", range(5))
def test_next_use_links_as_the_stable_sort_does(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nu, "worth_compiling", lambda _blocks: True)  # the compiled pass
    for tr in (random_trace(seed), _shuffled(seed)):
        rank = start_rank(tr)
        nxt, nrank = nu.next_use(tr, rank)
        ref_nxt, ref_nrank = sorted_next_use(tr, rank)
        assert nxt.dtype == ref_nxt.dtype
        assert nxt.tolist() == ref_nxt.tolist() and nrank.tolist() == ref_nrank.tolist()
        assert (nrank == NEVER).any() and (nxt >= 0).any()
