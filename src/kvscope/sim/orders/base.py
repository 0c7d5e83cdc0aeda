"""The eviction order: which evictable block goes first. One class per policy; LRU here.

An engine (pool.py for vLLM, radix.py for SGLang) owns the blocks and their reference counts;
an order only keeps the set of *evictable* blocks (cached, held by no running request) and
chooses among them. The engine calls, per request i, in this order:

- `start(i)` when i is scheduled (before its lookup);
- `touched(i, blocks)` with the blocks its lookup hit; those in the set leave it;
- `stored(i, blocks, j0)` with the blocks it took new, `blocks[k]` holding its block j0 + k
  (held, not in the set; some may stay blank: partial or unused);
- `released(i, blocks)` when i ends, with the blocks no running request holds any more, first
  to be evicted first (vLLM frees a request's blocks tail first);
- `pop()` whenever the engine needs a block and has no blank one: removes and returns the
  victim (the engine drops its key). `len(order)` is the number of evictable blocks;
- `finished(i)` when i ends, after `released` (if any of its blocks were freed).

Blocks are ints in [0, capacity). Hooks that a policy does not need are no-ops here.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from itertools import repeat

import numpy as np

from kvscope.sim.trace import Trace


class EvictionOrder:
    """Base class: the hooks above, all no-ops except the ones a policy must define."""

    name = "base"

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        """Called once before the replay; `rank[i]` is request i's position in start order."""

    def start(self, i: int) -> None:
        """Request i is being scheduled."""

    def touched(self, i: int, blocks: list[int]) -> None:
        raise NotImplementedError

    def stored(self, i: int, blocks: list[int], j0: int) -> None:
        """Request i took `blocks` new; `blocks[k]` holds its block j0 + k (held)."""

    def released(self, i: int, blocks: list[int]) -> None:
        raise NotImplementedError

    def finished(self, i: int) -> None:
        """Request i ended."""

    def pop(self) -> int:
        raise NotImplementedError

    def pop_many(self, m: int) -> list[int]:
        """`m` victims in eviction order (m <= len(self))."""
        return [self.pop() for _ in range(m)]

    def __len__(self) -> int:
        raise NotImplementedError


class LRUOrder(EvictionOrder):
    """vLLM's free block queue: released blocks go to the tail, the head is evicted first.

    A touched block leaves the queue; it re-enters at the tail when released again, so the order
    is least recently *released*, which is what vLLM measures. Every operation per request runs
    in C (OrderedDict), not in a Python loop per block.
    """

    name = "lru"

    def __init__(self) -> None:
        self._q: OrderedDict[int, None] = OrderedDict()

    def touched(self, i: int, blocks: list[int]) -> None:
        deque(map(self._q.pop, blocks, repeat(None)), maxlen=0)

    def released(self, i: int, blocks: list[int]) -> None:
        self._q.update(dict.fromkeys(blocks))

    def pop(self) -> int:
        return self._q.popitem(last=False)[0]

    def pop_many(self, m: int) -> list[int]:
        pop = self._q.popitem
        return [pop(False)[0] for _ in range(m)]

    def __len__(self) -> int:
        return len(self._q)


class KeyedHeapOrder(EvictionOrder):
    """An order kept as a heap of int keys, smallest evicted first, with lazy deletion.

    A block's key ends in the block itself (its low `bits` bits: blocks < 2**bits), so a popped
    key names its block; `_key[b]` is b's live key (-1: not evictable), and a popped key that is
    not the live one is stale and skipped. Subclasses make the keys: `keyed(blocks, keys)` puts
    released blocks in, `touched` takes them out.
    """

    def reset(self, capacity: int) -> None:
        self._bb = max(capacity - 1, 1).bit_length()
        self._mask = (1 << self._bb) - 1
        self._key: list[int] = [-1] * capacity  # live key per block; -1: not evictable
        self._heap: list[int] = []
        self._live = 0

    def touched(self, i: int, blocks: list[int]) -> None:
        key = self._key
        was = list(map(key.__getitem__, blocks))
        self._live -= len(was) - was.count(-1)
        deque(map(key.__setitem__, blocks, repeat(-1)), maxlen=0)

    def keyed(self, blocks: list[int], keys: list[int]) -> None:
        """`blocks` become evictable under `keys` (each ending in its block)."""
        key, heap = self._key, self._heap
        deque(map(key.__setitem__, blocks, keys), maxlen=0)
        deque(map(heapq.heappush, repeat(heap), keys), maxlen=0)
        self._live += len(blocks)
        if len(heap) > 2 * self._live + 1024:  # drop stale entries
            mask = self._mask
            self._heap = [k for k in heap if key[k & mask] == k]
            heapq.heapify(self._heap)

    def pop(self) -> int:
        return self.pop_many(1)[0]

    def pop_many(self, m: int) -> list[int]:
        heap, key, mask, pop = self._heap, self._key, self._mask, heapq.heappop
        out: list[int] = []
        while len(out) < m:
            k = pop(heap)
            b = k & mask
            if key[b] == k:
                key[b] = -1
                out.append(b)
        self._live -= m
        return out

    def __len__(self) -> int:
        return self._live
