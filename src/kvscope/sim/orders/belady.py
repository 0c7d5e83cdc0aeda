"""Belady's OPT: evict the evictable block whose key is next used farthest in the future.

The offline bound: the replay knows the whole trace. `next_use(trace, rank)` (next_use.py) gives
every flat position p the next position holding the same key in start order and the start rank
of its request, or `NEVER`. A block's next use is taken from the position where its key
was last stored or hit; if that request already started without using the block (it missed an
earlier block of its chain, so it stored a copy), the chain is followed to the first request
not yet started. Blocks whose key is never used again (and opaque output blocks) go first.

Belady is optimal for a single cache of independent items; with prefix chains (a hit needs all
earlier blocks) and pinned blocks it is the classic upper-bound heuristic, not a proven optimum.
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.orders.base import KeyedHeapOrder
from kvscope.sim.orders.next_use import NEVER, next_use
from kvscope.sim.trace import Trace


class BeladyOrder(KeyedHeapOrder):
    """Evict the block whose key is next used farthest ahead; ties: the deeper block of its
    chain first (evicting a chain's head wastes the blocks after it), then by block id.

    The heap holds one int per entry, (far, depth, block) packed in 63 bits (next rank, chain
    position and block id each in as many bits as the trace needs; Python ints beyond that),
    so pushes and pops compare ints, not tuples. An entry is live while `key[block]` equals it.
    """

    name = "belady"
    int_bits = 63  # pack heap keys in int64 when they fit (tests lower it)

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        self._rank = rank
        self._nxt, self._nrank = next_use(trace, rank)
        self._offsets = trace.offsets
        n = len(trace)
        longest = int(np.diff(trace.offsets).max(initial=0)) + 1
        self.reset(capacity)
        self._bj = max(longest, 1).bit_length()
        self._top = n + 2  # far = top - next rank: smaller is evicted first; NEVER -> 0
        self._jmax = (1 << self._bj) - 1
        self._packed = (n + 3).bit_length() + self._bj + self._bb <= self.int_bits
        # per flat position, the key's high part: (far, depth) packed; one more slot, 0, for
        # blocks without a position (opaque, blank). Made in place, in the array kept: two
        # arrays of the trace's size at a time besides the next-use links (a 100k-request
        # trace's replay peaked at ~3.5x its LRU replay's memory here)
        total = len(trace.keys)
        static = np.zeros(total + 1, dtype=np.int64)
        far = static[:total]  # top - next rank; 0 for none
        np.minimum(self._nrank, self._top, out=far)
        np.subtract(self._top, far, out=far)
        far[self._nrank == NEVER] = 0
        del self._nrank, far
        depth = np.arange(total, dtype=np.int64)
        depth -= np.repeat(trace.offsets[:-1], np.diff(trace.offsets))
        np.minimum(depth, self._jmax, out=depth)
        np.subtract(self._jmax, depth, out=depth)
        self._shift = self._bj + self._bb
        if self._packed:
            static <<= self._shift
            depth <<= self._bb
            static[:total] |= depth
        else:  # Python ints: no width limit
            static = static.astype(object)
            static[:total] = (static[:total] << self._shift) | (depth.astype(object) << self._bb)
        del depth
        self._static = static
        self._pos = np.full(capacity, -1, dtype=np.int64)  # flat position of the last use
        self._now = -1

    def packed_keys(self) -> tuple[np.ndarray, np.ndarray, int, int, int] | None:
        """What the compiled pool (caches/pool_compiled.py) needs to make this order's keys,
        once bound: (static per flat position + a 0 for none, next use per position, shift,
        top, block mask); None when the keys do not fit int64."""
        if not self._packed:
            return None
        return self._static, self._nxt, self._shift, self._top, self._mask

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
        barr = np.array(blocks, dtype=np.int64)
        pos = self._pos[barr]
        high = self._static[pos]
        if self._packed:  # far >= top - now  <=>  high >= (top - now) << shift
            late = np.flatnonzero(high >= (self._top - self._now) << self._shift)
            keys_a = high | barr
        else:
            late = np.flatnonzero([h >> self._shift >= self._top - self._now for h in high])
            keys_a = high | barr.astype(object)
        for k in late.tolist():  # its next request already started without it: follow on
            p = int(pos[k])
            while p >= 0 and self._top - (int(self._static[p]) >> self._shift) <= self._now:
                p = int(self._nxt[p])
            far = 0 if p < 0 else int(self._static[p]) >> self._shift
            keys_a[k] = (far << self._shift) | (int(high[k]) & ((1 << self._shift) - 1))
            keys_a[k] |= blocks[k]
        self.keyed(blocks, keys_a.tolist())
