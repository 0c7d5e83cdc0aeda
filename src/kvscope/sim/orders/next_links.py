"""The compiled pass of next_use.py: next position and rank per position, backward over the
positions in start order, the last position seen per key id."""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import compiled

NEVER = np.iinfo(np.int64).max


@compiled()
def links(
    kids: np.ndarray,
    nids: int,
    offsets: np.ndarray,
    by_rank: np.ndarray,
    rank: np.ndarray,
    nxt: np.ndarray,
    nrank: np.ndarray,
) -> None:
    last = np.full(nids, -1, dtype=np.int64)  # per key: the position seen last (next in order)
    last_rank = np.full(nids, NEVER, dtype=np.int64)
    for r in range(len(by_rank) - 1, -1, -1):
        i = by_rank[r]
        for p in range(offsets[i + 1] - 1, offsets[i] - 1, -1):
            k = kids[p]
            nxt[p] = last[k]
            nrank[p] = last_rank[k]
            last[k] = p
            last_rank[k] = rank[i]
