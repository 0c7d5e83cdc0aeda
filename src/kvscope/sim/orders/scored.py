"""Eviction orders by a per-block score: fifo, lfu, priority (SGLang's), and slru.

`ScoreOrder` keeps the evictable blocks in a heap and evicts the smallest (score, tick,
block); `tick` counts releases, so equal scores fall back to LRU (the block released first,
and within one release the request's tail first, as vLLM). Scores are non-negative ints taken
when a block is released; they do not change while it waits (nothing touches a waiting block
without taking it out). A heap entry is one int, the triple packed (computed in int64 when it
fits in 63 bits, else as Python ints: same values), so the heap compares ints, not tuples. An
entry is live while `key[block]` equals it; stale ones are skipped, and the heap is compacted
when they outnumber the live ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from kvscope.sim.orders.base import EvictionOrder, KeyedHeapOrder, LRUOrder
from kvscope.sim.trace import Trace


class ScoreOrder(KeyedHeapOrder):
    """Evict the evictable block with the smallest score; ties: least recently released.

    Subclasses define `scores(blocks)`: a non-negative int64 array, one per block.
    """

    name = "score"
    int_bits = 63  # compute heap keys in int64 when they fit (tests lower it)

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        computed = trace.prompt_tokens + trace.output_tokens - 1
        ticks = int((-(-computed // trace.block_size)).sum()) + 1  # releases, at most
        self.reset(capacity)
        self._bt = ticks.bit_length()
        self._low = self._bt + self._bb
        self._tick = 0

    def scores(self, blocks: list[int]) -> np.ndarray:
        raise NotImplementedError

    def released(self, i: int, blocks: list[int]) -> None:
        t, n = self._tick, len(blocks)
        sc = self.scores(blocks)
        ticks = np.arange(t + 1, t + n + 1, dtype=np.int64)
        if int(sc.max()) < 1 << max(self.int_bits - self._low, 0):
            keys = ((sc << self._low) | (ticks << self._bb) | np.asarray(blocks)).tolist()
        else:
            keys = [
                (s << self._low) | (k << self._bb) | b
                for s, k, b in zip(sc.tolist(), ticks.tolist(), blocks, strict=True)
            ]
        self.keyed(blocks, keys)
        self._tick = t + n


class FIFOOrder(ScoreOrder):
    """First stored, first evicted: the score is when the block got its key."""

    name = "fifo"

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        super().bind(trace, capacity, rank)
        self._born = np.zeros(capacity, dtype=np.int64)
        self._clock = 0

    def stored(self, i: int, blocks: list[int], j0: int) -> None:
        n = len(blocks)
        self._born[blocks] = np.arange(self._clock, self._clock + n)
        self._clock += n

    def scores(self, blocks: list[int]) -> np.ndarray:
        return self._born[blocks]


class LFUOrder(ScoreOrder):
    """Least frequently used: the score is the number of requests that used the block since it
    got its key (1 for its storer); ties LRU."""

    name = "lfu"

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        super().bind(trace, capacity, rank)
        self._uses = np.zeros(capacity, dtype=np.int64)

    def touched(self, i: int, blocks: list[int]) -> None:
        self._uses[blocks] += 1  # a request's blocks are distinct
        super().touched(i, blocks)

    def stored(self, i: int, blocks: list[int], j0: int) -> None:
        self._uses[blocks] = 1

    def scores(self, blocks: list[int]) -> np.ndarray:
        return self._uses[blocks]


class PriorityOrder(ScoreOrder):
    """SGLang's priority eviction: lowest priority first, ties LRU.

    A block's priority is the highest priority of the requests that used it since it got its
    key (SGLang propagates a request's priority to the nodes it inserts or matches). A higher
    value means more important. `priorities[i]` is request i's; the trace records none, so by
    default all are equal and the order is LRU.
    """

    name = "priority"

    def __init__(self, priorities: Sequence[float] | None = None) -> None:
        self._given = priorities

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        super().bind(trace, capacity, rank)
        given = self._given if self._given is not None else [0.0] * len(trace)
        if len(given) != len(trace):
            raise ValueError(f"{len(given)} priorities for {len(trace)} requests")
        # by rank among the distinct values: the heap wants non-negative ints
        self._req = np.unique(np.asarray(given, dtype=np.float64), return_inverse=True)[1]
        self._req = self._req.reshape(-1).tolist()
        self._prio = np.zeros(capacity, dtype=np.int64)

    def touched(self, i: int, blocks: list[int]) -> None:
        self._prio[blocks] = np.maximum(self._prio[blocks], self._req[i])
        super().touched(i, blocks)

    def stored(self, i: int, blocks: list[int], j0: int) -> None:
        self._prio[blocks] = self._req[i]

    def scores(self, blocks: list[int]) -> np.ndarray:
        return self._prio[blocks]


class SLRUOrder(EvictionOrder):
    """Segmented LRU: blocks used by one request wait in a probation segment, blocks used by two
    or more in a protected one; probation is evicted first (LRU within each). The protected
    segment holds at most `protected_fraction` of the capacity; above it, its LRU block is
    demoted to probation's MRU end.
    """

    name = "slru"

    def __init__(self, protected_fraction: float = 0.8) -> None:
        self._fraction = protected_fraction

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        self._probation = LRUOrder()
        self._protected: OrderedDict[int, None] = OrderedDict()
        self._cap = int(self._fraction * capacity)
        self._uses = [0] * capacity

    def touched(self, i: int, blocks: list[int]) -> None:
        self._probation.touched(i, blocks)
        prot, uses = self._protected, self._uses
        for b in blocks:
            uses[b] += 1
            prot.pop(b, None)

    def stored(self, i: int, blocks: list[int], j0: int) -> None:
        uses = self._uses
        for b in blocks:
            uses[b] = 1

    def released(self, i: int, blocks: list[int]) -> None:
        uses, prot = self._uses, self._protected
        once = [b for b in blocks if uses[b] < 2]
        if once:
            self._probation.released(i, once)
        if len(once) != len(blocks):
            prot.update(dict.fromkeys(b for b in blocks if uses[b] >= 2))
            over = len(prot) - self._cap
            if over > 0:
                self._probation.released(i, [prot.popitem(last=False)[0] for _ in range(over)])

    def pop(self) -> int:
        if len(self._probation):
            return self._probation.pop()
        return self._protected.popitem(last=False)[0]

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)
