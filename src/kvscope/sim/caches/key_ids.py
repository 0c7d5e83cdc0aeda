"""Dense ids of block keys: each distinct uint64 key -> 0, 1, 2, ... in order of first appearance.

The compiled simulators index their per-key state by these ids (arrays, not hash maps). An
open-addressing table, kept at most half full and grown by doubling, factorizes a trace's keys
in one pass (~30 ns a key); `key_ids` keeps the ids of the last keys array it was asked for, so
the cells of a sweep over one trace (and prompt_only's trace, which shares its keys) factorize
once.
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import compiled

_memo: list[tuple[np.ndarray, np.ndarray, int]] = []  # the last trace's keys and their ids


def key_ids(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids of `keys` (int32, 0..n-1 in order of first appearance) and n. The ids of the
    last keys array asked for are kept, so a sweep (many capacities or policies of one trace,
    and prompt_only's trace, which shares its keys) factorizes once."""
    if _memo and _memo[0][0] is keys:
        return _memo[0][1], _memo[0][2]
    kids, nids = _factorize(np.ascontiguousarray(keys, dtype=np.uint64))
    _memo[:] = [(keys, kids, int(nids))]
    return kids, int(nids)


@compiled(inline="always")
def _slot(key: np.uint64, mask: np.int64) -> np.int64:
    """Start slot of `key` (splitmix64's finalizer: sequential ids spread too)."""
    z = key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z & np.uint64(mask))


@compiled()
def _factorize(keys: np.ndarray) -> tuple[np.ndarray, np.int64]:
    """Dense ids of `keys` (int32, the order of first appearance) and how many there are: an
    open-addressing table, kept at most half full, grown by doubling."""
    size = 1 << 16
    tkey = np.zeros(size, dtype=np.uint64)
    tid = np.full(size, -1, dtype=np.int32)
    kids = np.empty(len(keys), dtype=np.int32)
    nids = 0
    for j in range(len(keys)):
        key = keys[j]
        mask = len(tid) - 1
        s = _slot(key, mask)
        while tid[s] >= 0 and tkey[s] != key:
            s = (s + 1) & mask
        if tid[s] < 0:
            tkey[s] = key
            tid[s] = nids
            nids += 1
            if 2 * nids > len(tid):  # grow: re-place every key
                size = 2 * len(tid)
                nkey = np.zeros(size, dtype=np.uint64)
                nid = np.full(size, -1, dtype=np.int32)
                mask = size - 1
                for t in range(len(tid)):
                    if tid[t] >= 0:
                        u = _slot(tkey[t], mask)
                        while nid[u] >= 0:
                            u = (u + 1) & mask
                        nkey[u] = tkey[t]
                        nid[u] = tid[t]
                tkey, tid = nkey, nid
            kids[j] = nids - 1
        else:
            kids[j] = tid[s]
    return kids, nids
