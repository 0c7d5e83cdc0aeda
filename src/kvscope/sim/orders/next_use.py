"""Each block position's next use, compiled: what Belady's order (belady.py) looks ahead with.

`next_use(trace, rank)`: for every flat position p of the trace's keys, the position of the
next occurrence of the same key when the requests' positions are laid out in start order (a
request's own positions in order), and the start rank of the request holding it; -1 / NEVER for
none. One backward pass over the positions in that order with the last position seen per key
(the keys as dense ids, caches/key_ids.py), ~10 ns a position: the same links as a stable sort
by key of the positions in start order, each linked to its successor in its group.
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import compiled
from kvscope.sim.caches.key_ids import key_ids
from kvscope.sim.trace import Trace

NEVER = np.iinfo(np.int64).max


def next_use(trace: Trace, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(next position, next rank) per flat position (module doc). Positions are int32 when
    they fit."""
    kids, nids = key_ids(trace.keys)
    itype = np.int32 if len(trace.keys) < 2**31 - 1 else np.int64
    by_rank = np.argsort(rank, kind="stable").astype(np.int64)
    nxt = np.empty(len(trace.keys), dtype=itype)
    nrank = np.empty(len(trace.keys), dtype=np.int64)
    _links(kids, nids, np.asarray(trace.offsets, dtype=np.int64), by_rank,
           np.asarray(rank, dtype=np.int64), nxt, nrank)  # fmt: skip
    return nxt, nrank


@compiled()
def _links(
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
