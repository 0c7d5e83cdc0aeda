"""The compiled one-pass LRU sweep: Mattson's stack distances at many capacities (stack.py).

Everything the kernels call is in this file but the key table's two functions (stream_kernel's
find_slot and delete_slot): numba's disk cache checks only the file of the function it compiled,
so code in another file would be used stale after that file changed. TABLE_SOURCE is the hash of
their source; tests/unit/sim/test_stack_sweep.py holds it equal, so a change there must change
this file too.

State, over dense key ids (key_ids.py) and flat key positions (trace.offsets' CSR), int32 (the
caller refuses a trace of 2**31 key positions or more):
- `last[id]`: the key's last-use time (-1: never). Times count blocks taken: the request of
  step s gets times starts[s] .. starts[s] + m - 1, its last key the least recent (tail first)
  or its first (head first).
- `buf[a:b]`: the last-use times of the `cmax` most recent keys, sorted (appended at b, trimmed
  at a, compacted in place from the first key a request takes out: near the top, mostly). A
  key's depth (1: most recent) is found by binary search; a key below the window is deeper than
  every capacity asked.
- owners, derived from previous occurrences: `stored[p]` (at how many of the smallest
  capacities the key at flat position p was stored new) and `prev[p]` (the key's previous
  occurrence stored at one capacity at least), `lastpos[id]` the latest such. A key's owner at
  capacity k is the request of its latest occurrence with stored > k. 9 bytes a key position
  whatever the number of capacities (an owner per key and capacity: 4 bytes times them).
- `bound[k, s]`: the last-use time at depth caps[k] after step s (-1: fewer keys). It only
  rises, so a key last used at t (in step s0) left capacity k in the first step after s0 whose
  bound passed t (a galloping search from s0; from the step it left caps[k - 1], deeper).
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import compiled
from kvscope.sim.caches.stream_kernel import delete_slot, find_slot

TABLE_SOURCE = "3a17292578c11555"  # stream_kernel's _slot, find_slot, delete_slot (module doc)
DEEP = np.iinfo(np.int64).max  # the depth of a key not in the window (cold, or below cmax)
DONE, REPEATS, ALL_BROKEN, BROKEN = 0, 1, 2, 3  # the kernels' status
A, B, CLOCK, KEYS = range(4)  # sweep_chunk's scalars kept between chunks


@compiled(inline="always")
def first_above(row: np.ndarray, lo: int, hi: int, t: int) -> int:
    """The first index in row[lo:hi] (nondecreasing; every value before lo is <= t) whose
    value is > t (hi: none), galloping from lo: the cost grows with the log of the distance
    from lo."""
    step = 1
    while lo + step < hi and row[lo + step - 1] <= t:
        lo += step
        step *= 2
    return _bisect_right(row, lo, min(hi, lo + step), t)


@compiled(inline="always")
def last_at_most(row: np.ndarray, hi: int, t: int) -> int:
    """The last index in row[:hi] (nondecreasing) whose value is <= t (-1: none)."""
    return _bisect_right(row, 0, hi, t) - 1


@compiled(inline="always")
def _bisect_right(row: np.ndarray, lo: int, hi: int, t: int) -> int:
    """The first index in row[lo:hi] (nondecreasing) whose value is > t (hi: none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if row[mid] <= t:
            lo = mid + 1
        else:
            hi = mid
    return lo


@compiled(inline="always")
def _hits(
    dep: np.ndarray, m: int, lim: int, caps: np.ndarray, h: np.ndarray, smin: np.ndarray
) -> None:
    """h[k]: the request's hits at caps[k], the keys before the first deeper than it (at most
    `lim`: the request's hit limit); smin[j]: the least depth of its keys from the j-th on;
    dep[j]: the depth of its j-th key, of m."""
    smin[m] = DEEP
    for j in range(m - 1, -1, -1):
        smin[j] = min(dep[j], smin[j + 1])
    nc = len(caps)
    cm = 0
    q = 0
    for j in range(lim):
        cm = max(cm, dep[j])
        while q < nc and caps[q] < cm:
            h[q] = j
            q += 1
        if q == nc:
            break
    for k in range(q, nc):
        h[k] = lim


@compiled(inline="always")
def _on_top(
    buf: np.ndarray,
    bkey: np.ndarray,
    at: np.ndarray,
    m: int,
    a: int,
    b: int,
    first: int,
    clock: int,
    keys: np.ndarray,
    lo: int,
    head_first: bool,
) -> tuple[int, int]:
    """The window (buf[a:b]) after a request of m keys: the keys it held leave their places
    (at[j] >= 0, the first at `first`) and all m go on top with times clock.. (moved to the
    start of buf where they would not fit). bkey (empty: not kept) follows buf with the keys,
    keys[lo + j] the request's j-th. (a, b) after."""
    keep = len(bkey) > 0
    if first < b:
        for j in range(m):
            if at[j] >= 0:
                buf[at[j]] = -1
        w = first
        for r in range(first, b):
            if buf[r] >= 0:
                buf[w] = buf[r]
                if keep:
                    bkey[w] = bkey[r]
                w += 1
        b = w
    if b + m > len(buf):
        for r in range(b - a):
            buf[r] = buf[a + r]
            if keep:
                bkey[r] = bkey[a + r]
        b -= a
        a = 0
    for j in range(m):
        buf[b + j] = clock + j
        if keep:
            bkey[b + j] = keys[lo + (j if head_first else m - 1 - j)]
    return a, b + m


@compiled()
def sweep(
    order: np.ndarray,
    offsets: np.ndarray,
    kids: np.ndarray,
    nids: int,
    limits: np.ndarray,
    caps: np.ndarray,
    head_first: bool,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """LRU at every capacity of `caps` (sorted, blocks) over the requests in `order`:
    (status, cached blocks (request x capacity), evictions and broken per capacity, harm rows
    (request, evictor << 32 | (owner + 1), blocks) by capacity, then in step order, and where
    capacity k's rows end). `limits[i]`: request i's hit limit. Status REPEATS: a request
    repeats a key; ALL_BROKEN: no capacity is a stack any more (the rest is partial)."""
    n, nc = len(order), len(caps)
    cmax = caps[nc - 1]
    maxm = 0
    for i in range(n):
        maxm = max(maxm, offsets[i + 1] - offsets[i])
    last = np.full(nids, -1, dtype=np.int32)
    prev = np.empty(len(kids), dtype=np.int32)
    lastpos = np.full(nids, -1, dtype=np.int32)
    stored = np.empty(len(kids), dtype=np.int8)  # nc < 128 (the caller splits more)
    starts = np.zeros(n, dtype=np.int64)  # the clock when step s began
    buf = np.zeros(4 * cmax + 2 * (maxm + 1), dtype=np.int64)
    a = b = 0
    clock = 0
    cached = np.zeros((n, nc), dtype=np.int64)
    used = np.zeros(nc, dtype=np.int64)  # blocks holding a key, per capacity
    evictions = np.zeros(nc, dtype=np.int64)
    broken = np.zeros(nc, dtype=np.bool_)
    nbroken = 0
    bound = np.full((nc, n), -1, dtype=np.int32)
    h = np.zeros(nc, dtype=np.int64)
    nokeys = np.zeros(0, dtype=kids.dtype)  # the window's keys are not kept: `last` has them
    tj = np.empty(maxm + 1, dtype=np.int64)  # per key of the request: its last use before
    dep = np.empty(maxm + 1, dtype=np.int64)  # its depth
    at = np.empty(maxm + 1, dtype=np.int64)  # its place in buf (-1: not in the window)
    smin = np.empty(maxm + 1, dtype=np.int64)  # the least depth from it to the prompt's end
    sj = np.empty(maxm + 1, dtype=np.int64)  # at how many capacities it is stored new
    packs = np.empty((nc, maxm + 1), dtype=np.int64)  # harm per capacity, this request
    cnt = np.zeros(nc, dtype=np.int64)
    rows = np.empty((1024, 3), dtype=np.int64)  # capacity << 32 | request, packed, blocks
    nrows = 0
    ends = np.zeros(nc + 1, dtype=np.int64)
    for step in range(n):
        i = order[step]
        lo = offsets[i]
        m = offsets[i + 1] - lo
        starts[step] = clock
        if m > 0:
            low = buf[a] if b > a else clock  # the window holds the times >= low
            first = b  # the first place in buf a key of this request leaves
            for j in range(m):
                kid = kids[lo + j]
                t = np.int64(last[kid])
                if t >= clock:
                    return REPEATS, cached, evictions, broken, rows[:0], ends
                tj[j] = t
                at[j] = -1
                dep[j] = DEEP
                if t >= 0 and t >= low:
                    p = first_above(buf, a, b, t) - 1  # buf[p] == t
                    at[j] = p
                    dep[j] = b - p
                    first = min(first, p)
                last[kid] = clock + (j if head_first else m - 1 - j)
            _hits(dep, m, min(limits[i], m), caps, h, smin)
            for k in range(nc):
                cached[i, k] = h[k]
                if not broken[k] and smin[h[k]] <= caps[k]:  # a key it cannot hit is cached
                    broken[k] = True
                    nbroken += 1
            if nbroken == nc:
                return ALL_BROKEN, cached, evictions, broken, rows[:0], ends
            q = 0
            for j in range(m):  # stored new at the sj[j] smallest capacities (h[k] <= j)
                while q < nc and h[q] <= j:
                    q += 1
                sj[j] = q
            for k in range(nc):
                took = m - h[k]
                over = used[k] + took - caps[k]
                if over > 0:
                    evictions[k] += over
                used[k] = min(used[k] + took, caps[k])
            for j in range(m):
                s = sj[j]
                if s == 0:
                    continue
                kid = kids[lo + j]
                p = np.int64(lastpos[kid])
                if tj[j] >= 0:  # used before, missed now: harmed at the s smallest capacities
                    e = last_at_most(starts, step, tj[j])  # the step that last used it
                    op = -2
                    owner = -1
                    for k in range(s):
                        e = first_above(bound[k], e, step, tj[j])
                        evictor = order[min(e, n - 1)]
                        while p >= 0 and stored[p] <= k:
                            p = prev[p]
                        if p != op:
                            owner = last_at_most(offsets, n, p) if p >= 0 else -1
                            op = p
                        packs[k, cnt[k]] = (evictor << 32) | (owner + 1)
                        cnt[k] += 1
                prev[lo + j] = lastpos[kid]
                lastpos[kid] = lo + j
                stored[lo + j] = s
            for k in range(nc):  # one row per (evictor, owner), sorted
                c = cnt[k]
                if c == 0:
                    continue
                packed = np.sort(packs[k, :c])
                cnt[k] = 0
                for u in range(c):
                    if u and packed[u] == packed[u - 1]:
                        rows[nrows - 1, 2] += 1
                        continue
                    if nrows == len(rows):
                        bigger = np.empty((2 * nrows, 3), dtype=np.int64)
                        bigger[:nrows] = rows
                        rows = bigger
                    rows[nrows, 0] = (k << 32) | i
                    rows[nrows, 1] = packed[u]
                    rows[nrows, 2] = 1
                    ends[k + 1] += 1
                    nrows += 1
            a, b = _on_top(buf, nokeys, at, m, a, b, first, clock, kids, lo, head_first)
            a = max(a, b - cmax)
            clock += m
        for k in range(nc):
            if b - a >= caps[k]:
                bound[k, step] = buf[b - caps[k]]
    for k in range(nc):
        ends[k + 1] += ends[k]
    out = np.empty((nrows, 3), dtype=np.int64)  # by capacity, each in step order
    fill = ends[:nc].copy()
    for r in range(nrows):
        k = rows[r, 0] >> 32
        out[fill[k], 0] = rows[r, 0] & 0xFFFFFFFF
        out[fill[k], 1] = rows[r, 1]
        out[fill[k], 2] = rows[r, 2]
        fill[k] += 1
    return DONE, cached, evictions, broken, out, ends


@compiled()
def sweep_chunk(
    offsets: np.ndarray,
    keys: np.ndarray,
    limits: np.ndarray,
    caps: np.ndarray,
    head_first: bool,
    st: np.ndarray,
    tkey: np.ndarray,
    tval: np.ndarray,
    buf: np.ndarray,
    bkey: np.ndarray,
    used: np.ndarray,
    evictions: np.ndarray,
    cached: np.ndarray,
) -> int:
    """`sweep` without harm rows, resumable: the next requests (one after another, in order;
    request i's keys keys[offsets[i]:offsets[i + 1]]) at every capacity of `caps`, the state
    kept between chunks. Keys, not dense ids: the table (tkey, tval: key -> last-use time, -2
    empty) holds only the keys in the window, buf[a:b] their times and bkey[a:b] the keys; a
    key leaves both when it falls below the window. The caller keeps the table at most half
    full and buf with room for the window and a request. cached[i, k]: request i's hits at
    caps[k]. Status: DONE, REPEATS (a request repeats a key) or BROKEN (at some capacity a key
    a request cannot hit is still cached: not a stack there)."""
    nc = len(caps)
    cmax = caps[nc - 1]
    a, b, clock = st[A], st[B], st[CLOCK]
    maxm = 0
    for i in range(len(offsets) - 1):
        maxm = max(maxm, offsets[i + 1] - offsets[i])
    dep = np.empty(maxm + 1, dtype=np.int64)
    at = np.empty(maxm + 1, dtype=np.int64)
    smin = np.empty(maxm + 1, dtype=np.int64)
    h = np.zeros(nc, dtype=np.int64)
    status = DONE
    for i in range(len(offsets) - 1):
        lo = offsets[i]
        m = offsets[i + 1] - lo
        if m == 0:
            continue
        low = buf[a] if b > a else clock
        first = b
        for j in range(m):
            key = keys[lo + j]
            s = find_slot(tkey, tval, key)
            t = tval[s]
            if t >= clock:
                status = REPEATS
                break
            at[j] = -1
            dep[j] = DEEP
            if t >= low:  # in the window (a key that left it left the table)
                p = first_above(buf, a, b, t) - 1
                at[j] = p
                dep[j] = b - p
                first = min(first, p)
            else:
                tkey[s] = key
                st[KEYS] += 1
            tval[s] = clock + (j if head_first else m - 1 - j)
        if status != DONE:
            break
        _hits(dep, m, min(limits[i], m), caps, h, smin)
        for k in range(nc):
            cached[i, k] = h[k]
            if smin[h[k]] <= caps[k]:
                status = BROKEN
            took = m - h[k]
            evictions[k] += max(used[k] + took - caps[k], 0)
            used[k] = min(used[k] + took, caps[k])
        if status != DONE:
            break
        a, b = _on_top(buf, bkey, at, m, a, b, first, clock, keys, lo, head_first)
        while b - a > cmax:  # below the window: out of the table
            s = find_slot(tkey, tval, bkey[a])
            if tval[s] == buf[a]:
                delete_slot(tkey, tval, s)
                st[KEYS] -= 1
            a += 1
        clock += m
    st[A], st[B], st[CLOCK] = a, b, clock
    return status
