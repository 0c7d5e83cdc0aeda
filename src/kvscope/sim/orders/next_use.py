"""Each block position's next use, compiled: what Belady's order (belady.py) looks ahead with.

`next_use(trace, rank)`: for every flat position p of the trace's keys, the position of the
next occurrence of the same key when the requests' positions are laid out in start order (a
request's own positions in order), and the start rank of the request holding it; -1 / NEVER for
none. One backward pass over the positions in that order with the last position seen per key
(the keys as dense ids, caches/key_ids.py; the pass compiled, next_links.py), ~10 ns a position:
the same links as a stable sort by key of the positions in start order, each linked to its
successor in its group (`sorted_next_use`, numpy, which traces too small for the compiled code
to pay use: compiled.worth_compiling).
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import worth_compiling
from kvscope.sim.trace import Trace

NEVER = np.iinfo(np.int64).max


def next_use(trace: Trace, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(next position, next rank) per flat position (module doc). Positions are int32 when
    they fit."""
    if not worth_compiling(len(trace.keys)):
        return sorted_next_use(trace, rank)
    from kvscope.sim.caches.key_ids import key_ids
    from kvscope.sim.orders.next_links import links

    kids, nids = key_ids(trace.keys)
    itype = np.int32 if len(trace.keys) < 2**31 - 1 else np.int64
    by_rank = np.argsort(rank, kind="stable").astype(np.int64)
    nxt = np.empty(len(trace.keys), dtype=itype)
    nrank = np.empty(len(trace.keys), dtype=np.int64)
    links(kids, nids, np.asarray(trace.offsets, dtype=np.int64), by_rank,
          np.asarray(rank, dtype=np.int64), nxt, nrank)  # fmt: skip
    return nxt, nrank


def sorted_next_use(trace: Trace, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """next_use without compiling: a stable sort by key of the positions in start order, each
    linked to its successor in its group (numpy; for traces too small to pay for loading the
    compiled pass)."""
    counts = np.diff(trace.offsets)
    total = len(trace.keys)
    itype = np.int32 if total < 2**31 - 1 else np.int64
    by_rank = np.argsort(rank, kind="stable")
    c = counts[by_rank]  # flat positions, requests in start order
    pos = np.repeat((trace.offsets[:-1][by_rank] - (np.cumsum(c) - c)).astype(itype), c)
    pos += np.arange(total, dtype=itype)
    kp = trace.keys[pos]  # keys in start order
    o = np.argsort(kp, kind="stable")  # grouped by key, each group in start order
    ks = kp[o]
    del kp
    same = ks[1:] == ks[:-1]  # o[j + 1] is o[j]'s next use
    del ks
    s = pos[o]
    del pos
    nxt = np.full(total, -1, dtype=itype)
    nxt[s[:-1]] = np.where(same, s[1:], -1)
    del s, o, same
    # gathered along nxt, which mostly points a few requests ahead: cache-friendly
    nrank = np.where(nxt >= 0, np.repeat(rank, counts)[nxt], NEVER)
    return nxt, nrank
