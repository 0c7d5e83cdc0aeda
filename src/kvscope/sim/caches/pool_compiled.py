"""vLLM's block pool, compiled: pool.py's rules in one numba kernel, under LRU or Belady.

`simulate_pool` (pool.py) calls `simulate_compiled` for the orders it runs (LRU and no cache;
Belady with int64 keys) without a host tier. The rules are pool.py's docstring, replayed event
by event in machine code (pool_kernel.py): the blank blocks a stack, the order's evictable blocks as
the kernel keeps them (LRU's free queue a linked list, Belady's keys a heap), the keys as
dense ids (key_ids.py, once per trace) so the key index is two arrays by id (the first block
holding the key, who evicted its last copy), later blocks holding the same key a linked list per
key in the order stored, each running request's blocks in a flat arena (as large as the blocks
running requests hold at once).

Contract: the same SimResult as pool.py's Python path with the same order (cached blocks,
preemptions, evictions, harm rows), which tests/unit/sim holds on random traces, repeated keys,
preemption, head-first order and no cache. Only `seconds` differs. (Where a prompt repeats a key,
the Python Belady counts the repeated block twice as evictable; the kernel once.)

Cost: compiled on first use and kept on disk (compiled.py); then a replay is the load of the
cached code (~0.3-0.5 s), the keys' factorization once per trace and one pass over the events per
capacity (measured in README's What-if replay section).
"""

from __future__ import annotations

import time

import numpy as np

from kvscope.sim.caches.events import event_order
from kvscope.sim.caches.key_ids import key_ids
from kvscope.sim.caches.pool_kernel import BELADY, LRU, replay
from kvscope.sim.caches.result import SimResult
from kvscope.sim.orders.base import EvictionOrder, LRUOrder
from kvscope.sim.orders.belady import BeladyOrder
from kvscope.sim.trace import Trace


def simulate_compiled(
    trace: Trace,
    capacity_blocks: int,
    order: EvictionOrder,
    rank: np.ndarray,
    *,
    caching: bool = True,
    head_first: bool = False,
) -> SimResult | None:
    """pool.py's `simulate_pool(trace, capacity_blocks, order, caching=..., head_first=...)`
    where `order` (bound to the trace, `rank` its start ranks) is one the kernel runs (LRU, or
    Belady with int64 keys); None for any other."""
    arrays = _order_arrays(order)
    if arrays is None:
        return None
    started = time.perf_counter()
    n, bs = len(trace), trace.block_size
    prompt = np.ascontiguousarray(trace.prompt_tokens, dtype=np.int64)
    output = np.ascontiguousarray(trace.output_tokens, dtype=np.int64)
    # a pool larger than every block the requests take together behaves as that many blocks
    # (none is ever evicted): an 'unbounded' capacity costs the trace's blocks, not its own
    demand = int(np.maximum(-(-(prompt + output - 1) // bs), 0).sum())
    reqs, kinds = event_order(trace)
    cached, preempted, evictions, harm = replay(
        reqs.astype(np.int64),
        kinds.astype(np.int8),
        prompt,
        output,
        np.ascontiguousarray(trace.offsets, dtype=np.int64),
        *key_ids(trace.keys),
        np.int64(bs),
        np.int64(max(min(capacity_blocks, demand), 1)),
        caching,
        head_first,
        np.ascontiguousarray(rank, dtype=np.int64),
        *arrays,
    )
    return SimResult(
        policy=order.name if caching else "none",
        capacity_blocks=capacity_blocks,
        block_size=bs,
        cached_blocks=cached,
        host_blocks=np.zeros(n, dtype=np.int64),
        prefetched_blocks=None,
        preempted=preempted,
        evictions=int(evictions),
        seconds=time.perf_counter() - started,
        **harm_rows(harm),
    )


_NO_KEYS = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int32), 0, 0, 0)


def _order_arrays(order: EvictionOrder) -> tuple | None:
    """(kind, static, nxt, shift, top, mask) of an order the kernel runs, else None."""
    if type(order) is LRUOrder:
        return (LRU, *_NO_KEYS)
    if type(order) is BeladyOrder:
        keys = order.packed_keys()
        return None if keys is None else (BELADY, *keys)
    return None


def warm(trace: Trace) -> None:
    """Load the compiled code and factorize `trace`'s keys now (simulate.prepare)."""
    key_ids(trace.keys)
    one = np.zeros(1, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    replay(empty, empty.astype(np.int8), empty, empty, one, empty.astype(np.int32), 0,
            np.int64(1), np.int64(1), True, False, empty, LRU, *_NO_KEYS)  # fmt: skip


def harm_rows(harm: np.ndarray, presorted: bool = False) -> dict[str, np.ndarray]:
    """A kernel's (request, evictor << 32 | (owner + 1), blocks) rows, distinct within a
    request -> pool.harm_arrays' rows, sorted by (request, evictor, owner) (`presorted`: they
    are already)."""
    if not presorted:
        harm = harm[np.lexsort((harm[:, 1], harm[:, 0]))]
    return {
        "harm_request": harm[:, 0].copy(),
        "harm_evictor": harm[:, 1] >> 32,
        "harm_owner": (harm[:, 1] & 0xFFFFFFFF) - 1,
        "harm_blocks": harm[:, 2].copy(),
    }
