"""Belady's OPT: evict the evictable block whose key is next used farthest in the future.

The offline bound: the replay knows the whole trace. `next_use(trace, rank)` is one pass over
the flat keys (a stable sort by key of the positions in start order, then each position's
successor in its group): for every flat position p, the start rank of the next request that
contains the same key, or `NEVER`. A block's next use is taken from the position where its key
was last stored or hit; if that request already started without using the block (it missed an
earlier block of its chain, so it stored a copy), the chain is followed to the first request
not yet started. Blocks whose key is never used again (and opaque output blocks) go first.

Belady is optimal for a single cache of independent items; with prefix chains (a hit needs all
earlier blocks) and pinned blocks it is the classic upper-bound heuristic, not a proven optimum.
"""

from __future__ import annotations

import numpy as np

from kvscope.replay.policies import ScoreOrder
from kvscope.replay.trace import Trace

NEVER = np.iinfo(np.int64).max


def next_use(trace: Trace, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(next position, next rank) per flat position: the next occurrence of the same key in a
    later-starting request (-1 / NEVER if none)."""
    counts = np.diff(trace.offsets)
    by_rank = np.argsort(rank, kind="stable")
    # flat positions, requests in start order
    c = counts[by_rank]
    local = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
    pos = np.repeat(trace.offsets[:-1][by_rank], c) + local
    s = pos[np.argsort(trace.keys[pos], kind="stable")]
    same = trace.keys[s[1:]] == trace.keys[s[:-1]]
    nxt = np.full(len(trace.keys), -1, dtype=np.int64)
    nxt[s[:-1][same]] = s[1:][same]
    req_rank = np.repeat(rank, counts)
    nrank = np.where(nxt >= 0, req_rank[nxt], NEVER)
    return nxt, nrank


class BeladyOrder(ScoreOrder):
    """Score = minus the next use's start rank: the farthest next use is evicted first."""

    name = "belady"

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        super().bind(trace, capacity, rank)
        self._rank = rank
        self._nxt, self._nrank = next_use(trace, rank)
        self._offsets = trace.offsets
        self._pos = np.full(capacity, -1, dtype=np.int64)  # where the block was last used
        self._now = -1
        self._next: dict[int, int] = {}

    def start(self, i: int) -> None:
        self._now = int(self._rank[i])

    def touched(self, i: int, blocks: list[int]) -> None:
        o = int(self._offsets[i])
        self._pos[blocks] = np.arange(o, o + len(blocks))
        super().touched(i, blocks)

    def stored(self, i: int, blocks: list[int], j0: int) -> None:
        o = int(self._offsets[i]) + j0
        n = min(len(blocks), int(self._offsets[i + 1]) - o)  # beyond: opaque or blank
        self._pos[blocks[:n]] = np.arange(o, o + n)
        self._pos[blocks[n:]] = -1

    def released(self, i: int, blocks: list[int]) -> None:
        pos = self._pos[blocks]
        nr = np.where(pos >= 0, self._nrank[pos], NEVER)
        late = np.flatnonzero(nr <= self._now)
        for k in late.tolist():  # its next request already started without it: follow on
            p = int(pos[k])
            while p >= 0 and self._nrank[p] <= self._now:
                p = int(self._nxt[p])
            nr[k] = NEVER if p < 0 else self._nrank[p]
        self._next = dict(zip(blocks, nr.tolist(), strict=True))
        super().released(i, blocks)

    def score(self, b: int) -> int:
        return -self._next[b]
