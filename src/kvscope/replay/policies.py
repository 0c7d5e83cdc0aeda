"""Eviction orders by a per-block score: fifo, lfu, priority (SGLang's), and slru.

`ScoreOrder` keeps the evictable blocks in a heap of (score, tick, block) and evicts the
smallest; `tick` counts releases, so equal scores fall back to LRU (the block released first,
and within one release the request's tail first, as vLLM). Scores are taken when a block is
released and do not change while it waits (nothing touches a waiting block without taking it
out). Entries of blocks taken out stay in the heap, stale, and are skipped (a stamp per block);
the heap is compacted when stale entries outnumber live ones.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np

from kvscope.replay.order import EvictionOrder, LRUOrder
from kvscope.replay.trace import Trace


class ScoreOrder(EvictionOrder):
    """Evict the evictable block with the smallest score; ties: least recently released.

    Subclasses define `scores(blocks)` (one per block, comparable), vectorised where they can.
    """

    name = "score"

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        self._heap: list[tuple[Any, int, int]] = []
        self._stamp = np.zeros(capacity, dtype=np.int64)  # tick of the live entry; 0: none
        self._live = 0
        self._tick = 0

    def scores(self, blocks: list[int]) -> list[Any]:
        raise NotImplementedError

    def touched(self, i: int, blocks: list[int]) -> None:
        self._live -= int(np.count_nonzero(self._stamp[blocks]))
        self._stamp[blocks] = 0

    def released(self, i: int, blocks: list[int]) -> None:
        t, n, heap = self._tick, len(blocks), self._heap
        self._stamp[blocks] = np.arange(t + 1, t + n + 1)
        entries = zip(self.scores(blocks), range(t + 1, t + n + 1), blocks, strict=True)
        deque(map(heapq.heappush, repeat(heap), entries), maxlen=0)
        self._tick = t + n
        self._live += n
        if len(heap) > 2 * self._live + 1024:  # drop stale entries
            tb = np.array([(e[1], e[2]) for e in heap], dtype=np.int64)
            keep = (self._stamp[tb[:, 1]] == tb[:, 0]).tolist()
            self._heap = [e for e, k in zip(heap, keep, strict=True) if k]
            heapq.heapify(self._heap)

    def pop(self) -> int:
        heap, stamp = self._heap, self._stamp
        while True:
            _, t, b = heapq.heappop(heap)
            if stamp.item(b) == t:
                stamp[b] = 0
                self._live -= 1
                return b

    def __len__(self) -> int:
        return self._live


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

    def scores(self, blocks: list[int]) -> list[Any]:
        return self._born[blocks].tolist()


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

    def scores(self, blocks: list[int]) -> list[Any]:
        return self._uses[blocks].tolist()


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
        self._req = [float(p) for p in given]
        self._prio = np.zeros(capacity, dtype=np.float64)

    def touched(self, i: int, blocks: list[int]) -> None:
        self._prio[blocks] = np.maximum(self._prio[blocks], self._req[i])
        super().touched(i, blocks)

    def stored(self, i: int, blocks: list[int], j0: int) -> None:
        self._prio[blocks] = self._req[i]

    def scores(self, blocks: list[int]) -> list[Any]:
        return self._prio[blocks].tolist()


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
