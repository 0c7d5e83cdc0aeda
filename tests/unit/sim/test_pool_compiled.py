"""The compiled pool (sim/caches/pool_compiled.py: LRU, Belady) against pool.py's Python
replay: the same result on every kind of trace."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from sim_helpers import make_trace, random_trace

from kvscope.sim.caches.events import start_rank
from kvscope.sim.caches.pool import simulate_pool
from kvscope.sim.caches.result import SimResult
from kvscope.sim.orders.base import EvictionOrder, LRUOrder
from kvscope.sim.orders.belady import BeladyOrder
from kvscope.sim.trace import Trace, prompt_only


def _both(
    tr: Trace, cap: int, order: Callable[[], EvictionOrder] = LRUOrder, **kw: bool
) -> tuple[SimResult, SimResult]:
    return (
        simulate_pool(tr, cap, order(), compiled=True, **kw),
        simulate_pool(tr, cap, order(), compiled=False, **kw),
    )


def _same(a: SimResult, b: SimResult) -> None:
    assert a.policy == b.policy
    assert a.cached_blocks.tolist() == b.cached_blocks.tolist()
    assert a.preempted.tolist() == b.preempted.tolist()
    assert a.evictions == b.evictions
    for f in ("harm_request", "harm_evictor", "harm_owner", "harm_blocks"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f
        assert getattr(a, f).dtype == np.int64


def _messy_trace(seed: int, n: int = 80, block_size: int = 4, repeats: bool = True) -> Trace:
    """Keys drawn from a small alphabet, not chained: a prompt repeats keys (unless `repeats`
    is False), a key it misses early is held later (two copies in the pool), lifetimes overlap,
    outputs span blocks."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 9, size=n)
    blocks = [rng.choice(12, size=int(k), replace=repeats).tolist() for k in sizes]
    start = np.cumsum(rng.exponential(1.0, size=n))
    tr = make_trace(
        blocks, start=start.tolist(), end=(start + rng.exponential(2.0, size=n)).tolist()
    )
    extra = rng.integers(-1, block_size, size=n)  # prompts with a partial block, or whole
    prompt = np.maximum(np.diff(tr.offsets) * block_size + extra, 0)
    output = rng.integers(0, 3 * block_size, size=n)
    return Trace(**{**tr.__dict__, "prompt_tokens": prompt, "output_tokens": output})


@pytest.mark.parametrize("seed", range(8))
def test_compiled_lru_equals_the_python_pool(seed: int) -> None:
    harmed = preempted = 0
    for tr in (random_trace(seed), _messy_trace(seed)):
        for t in (tr, prompt_only(tr)):
            for cap in (3, 8, 16, 40):
                for head_first in (False, True):
                    for caching in (True, False):
                        fast, slow = _both(t, cap, head_first=head_first, caching=caching)
                        _same(fast, slow)
                        harmed += len(fast.harm_request)
                        preempted += int(fast.preempted.sum())
    assert harmed and preempted  # harm rows and preemption are exercised


@pytest.mark.parametrize("seed", range(8))
def test_compiled_belady_equals_the_python_pool(seed: int) -> None:
    """Belady's keys (next use, chain depth, block) made and popped in the kernel as
    orders/belady.py makes them, the follow-on past started requests included. Prompts do not
    repeat a key here: the Python order counts such a block twice (module doc)."""
    harmed = preempted = 0
    for tr in (random_trace(seed), _messy_trace(seed, repeats=False)):
        for t in (tr, prompt_only(tr)):
            for cap in (3, 8, 16, 40):
                for head_first in (False, True):
                    fast, slow = _both(t, cap, BeladyOrder, head_first=head_first)
                    assert fast.policy == "belady"
                    _same(fast, slow)
                    harmed += len(fast.harm_request)
                    preempted += int(fast.preempted.sum())
    assert harmed and preempted


def test_belady_keys_beyond_int64_are_replayed_in_python() -> None:
    class Wide(BeladyOrder):
        int_bits = 12  # the keys do not fit: the order is not packed

    tr = random_trace(3)
    wide = Wide()
    wide.bind(tr, 8, start_rank(tr))
    assert wide.packed_keys() is None and BeladyOrder.int_bits == 63
    fallback = simulate_pool(tr, 8, Wide(), compiled=True)  # the kernel declines it
    _same(fallback, simulate_pool(tr, 8, BeladyOrder(), compiled=False))


def test_a_pool_larger_than_the_trace_needs_is_replayed_as_the_blocks_it_takes() -> None:
    """The kernel sizes its arrays by min(capacity, the blocks all requests take together):
    the same result as the Python pool with every block of a huge capacity."""
    tr = random_trace(4)
    demand = int(np.maximum(-(-(tr.prompt_tokens + tr.output_tokens - 1) // 4), 0).sum())
    for cap in (demand - 1, demand, demand + 1, 2_000_000):
        for order in (LRUOrder, BeladyOrder):
            fast, slow = _both(tr, cap, order)
            _same(fast, slow)
            assert fast.capacity_blocks == cap and fast.evictions == 0
    # all running at once, nothing shared: every block is needed together
    held = make_trace([[10 * i + j for j in range(3)] for i in range(5)],
                      start=[0, 1, 2, 3, 4], end=[100] * 5, output=9)  # fmt: skip
    need = int(np.maximum(-(-(held.prompt_tokens + held.output_tokens - 1) // 4), 0).sum())
    assert _both(held, need - 1)[0].preempted.any()
    for cap in (need, 10**6):
        fast, slow = _both(held, cap)
        _same(fast, slow)
        assert not fast.preempted.any()


def test_compiled_lru_on_a_trace_without_requests_or_keys() -> None:
    for tr in (make_trace([]), make_trace([[], [], []])):
        _same(*_both(tr, 4))


def test_compiled_lru_moves_running_requests_blocks_when_its_arena_fills() -> None:
    """More blocks taken over the trace than the arena's first size (65,536), some requests
    running across many refills: their blocks must survive each move to the front."""
    rng = np.random.default_rng(7)
    n = 5000
    blocks = [(rng.integers(0, 2000, size=int(rng.integers(20, 60)))).tolist() for _ in range(n)]
    start = np.arange(n, dtype=float)
    end = start + np.where(rng.random(n) < 0.02, 2000.0, rng.exponential(3.0, size=n))
    tr = make_trace(blocks, start=start.tolist(), end=end.tolist(), output=9)
    assert int(np.diff(tr.offsets).sum()) > 2 * 65_536
    for cap in (1500, 2500):  # evicting and preempting: a lost block would show
        _same(*_both(tr, cap))
        _same(*_both(tr, cap, head_first=True))
        _same(*_both(tr, cap, BeladyOrder))


def test_a_sweep_runs_compiled_where_its_blocks_together_pay_for_it() -> None:
    """simulate.prepare: 1,000,000 blocks to replay (keys x compiled cells) or more; the trace's
    keys are factorized then, once; vLLM's compiled policies only."""
    from kvscope.sim.caches import key_ids
    from kvscope.sim.simulate import prepare

    tr = make_trace([list(range(k, k + 100)) for k in range(0, 250_000, 100)])  # 250k keys
    key_ids._memo.clear()
    assert not prepare(tr, [("lru", 64), ("belady", 64), ("steps-to-execution", 64)])
    assert not key_ids._memo
    assert not prepare(tr, [("lru", c) for c in range(8)], engine="sglang")
    assert prepare(tr, [("lru", c) for c in range(3)] + [("none", 9)])
    assert key_ids._memo and key_ids._memo[0][0] is tr.keys
