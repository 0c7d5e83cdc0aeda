"""The compiled pool's kernel: pool.py's rules over dense key ids, with its eviction orders.

Everything the kernel calls is in this file: numba's disk cache checks only the file of the
function it compiled, so code in another file would be used stale after that file changed.

Orders (`kind`):
- LRU: vLLM's free block queue (orders/base.py's LRUOrder) as a doubly linked list over block
  ids: `nxt`, `prv`, `inq` per block and `meta` = [head, tail, length]. Released blocks join at
  the tail, a touched block leaves, victims come from the head.
- BELADY: orders/belady.py's BeladyOrder, its keys packed in int64 (the order computes them when
  it binds to the trace): a binary min-heap of keys with lazy deletion, `key[b]` the live key of
  block b (-1: not evictable) and `meta` = [heap size, live blocks]. A key ends in its block id
  (`mask` bits), so a popped key that is not its block's live one is stale and skipped. Which
  block goes depends only on the set of live keys, so the heap's layout (and when stale entries
  are dropped) changes nothing observable.
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import compiled
from kvscope.sim.caches.states import BLANK, KEYED, OPAQUE

LRU, BELADY = 0, 1  # the kernel's order kinds


@compiled(inline="always")
def queue_remove(
    nxt: np.ndarray, prv: np.ndarray, inq: np.ndarray, meta: np.ndarray, b: int
) -> None:
    if not inq[b]:
        return
    inq[b] = False
    if prv[b] >= 0:
        nxt[prv[b]] = nxt[b]
    else:
        meta[0] = nxt[b]
    if nxt[b] >= 0:
        prv[nxt[b]] = prv[b]
    else:
        meta[1] = prv[b]
    meta[2] -= 1


@compiled(inline="always")
def queue_append(
    nxt: np.ndarray, prv: np.ndarray, inq: np.ndarray, meta: np.ndarray, b: int
) -> None:
    prv[b] = meta[1]
    nxt[b] = -1
    if meta[1] >= 0:
        nxt[meta[1]] = b
    else:
        meta[0] = b
    meta[1] = b
    inq[b] = True
    meta[2] += 1


@compiled(inline="always")
def queue_pop(nxt: np.ndarray, prv: np.ndarray, inq: np.ndarray, meta: np.ndarray) -> int:
    b = meta[0]
    meta[0] = nxt[b]
    if meta[0] >= 0:
        prv[meta[0]] = -1
    else:
        meta[1] = -1
    inq[b] = False
    meta[2] -= 1
    return b


@compiled()
def heap_push(
    heap: np.ndarray, key: np.ndarray, meta: np.ndarray, k: int, b: int, mask: int
) -> np.ndarray:
    """Block b evictable under key k; returns the heap (a new array when it grew or was
    compacted: entries no longer live are dropped when they outnumber the live ones)."""
    key[b] = k
    meta[1] += 1
    if meta[0] == len(heap):
        size = meta[0]
        if size > 2 * meta[1] + 1024:  # mostly stale: keep the live keys (sorted: a heap)
            kept = heap[:size][key[heap[:size] & mask] == heap[:size]]
            heap = np.empty(max(2 * len(kept), 1024), dtype=np.int64)
            heap[: len(kept)] = np.sort(kept)
            meta[0] = len(kept)
        else:
            bigger = np.empty(2 * len(heap), dtype=np.int64)
            bigger[:size] = heap[:size]
            heap = bigger
    i = meta[0]
    meta[0] += 1
    while i > 0:
        parent = (i - 1) // 2
        if heap[parent] <= k:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = k
    return heap


@compiled()
def heap_pop_live(heap: np.ndarray, key: np.ndarray, meta: np.ndarray, mask: int) -> int:
    """The block of the smallest live key, no longer evictable."""
    while True:
        top = heap[0]
        meta[0] -= 1
        size = meta[0]
        last = heap[size]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and heap[c + 1] < heap[c]:
                c += 1
            if heap[c] >= last:
                break
            heap[i] = heap[c]
            i = c
        if size > 0:
            heap[i] = last
        b = top & mask
        if key[b] == top:
            key[b] = -1
            meta[1] -= 1
            return b


@compiled(inline="always")
def belady_key(
    b: int, p: int, static: np.ndarray, nxt: np.ndarray, shift: int, top: int, now: int
) -> int:
    """BeladyOrder.released's key of block b last used at flat position p (-1: none): its next
    use's (far, depth), following the key's later uses past requests that already started."""
    high = static[p] if p >= 0 else 0
    if high < (top - now) << shift:
        return high | b
    q = p
    while q >= 0 and top - (static[q] >> shift) <= now:
        q = nxt[q]
    far = 0 if q < 0 else static[q] >> shift
    return (far << shift) | (high & ((1 << shift) - 1)) | b


@compiled()
def replay(
    reqs: np.ndarray,
    kinds: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    offsets: np.ndarray,
    kids: np.ndarray,
    nids: int,
    bs: int,
    cap: int,
    caching: bool,
    head_first: bool,
    rank: np.ndarray,
    kind: int,
    static: np.ndarray,
    nxt: np.ndarray,
    shift: int,
    top: int,
    mask: int,
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """pool.py's replay over dense key ids: (cached blocks, preempted, evictions, harm rows
    (request, evictor << 32 | (owner + 1), blocks), counted within each request). `kind`: the
    order (LRU, or BELADY with its bound keys: static .. mask)."""
    n = len(prompt)
    # per key id: the first block holding it (-1: none), who evicted its last copy
    first = np.full(nids, -1, dtype=np.int32)
    evicted = np.full(nids, -1, dtype=np.int64)  # evictor << 32 | (owner + 1)
    # blocks
    ref = np.zeros(cap, dtype=np.int64)
    state = np.zeros(cap, dtype=np.int8)
    kid_of = np.full(cap, -1, dtype=np.int32)
    owner_of = np.full(cap, -1, dtype=np.int64)
    dnext = np.full(cap, -1, dtype=np.int64)  # later blocks holding the same key, stored order
    dprev = np.full(cap, -1, dtype=np.int64)
    seen = np.zeros(cap, dtype=np.int64)
    stamp = 0
    blank = np.empty(cap, dtype=np.int64)  # a stack: the top is taken first
    for j in range(cap):
        blank[j] = cap - 1 - j
    sp = cap
    # the order (compiled_orders.py): LRU's free queue, or Belady's heap
    qnext = np.full(cap, -1, dtype=np.int64)
    qprev = np.full(cap, -1, dtype=np.int64)
    inq = np.zeros(cap, dtype=np.bool_)
    qmeta = np.array([-1, -1, 0], dtype=np.int64)  # head, tail, length
    heap = np.empty(1024, dtype=np.int64)
    hkey = np.full(cap, -1, dtype=np.int64)  # a block's live key
    hmeta = np.zeros(2, dtype=np.int64)  # heap size, live blocks
    bpos = np.full(cap, -1, dtype=np.int64)  # flat position of a block's last use
    now = -1
    # requests
    # running requests' blocks, tail first: request i's at arena[hstart[i]:hstart[i] + hn[i]],
    # appended at `pos`; when full, the running ones are moved to the front (and it grows when
    # they fill half of it), so it is as large as the blocks held at once, not the trace's
    arena = np.empty(max(4 * cap, 1 << 16), dtype=np.int32)
    pos = 0
    hstart = np.zeros(n, dtype=np.int64)
    hn = np.zeros(n, dtype=np.int64)
    live = np.empty(n, dtype=np.int64)  # the running requests; live_at[i]: i's place in it
    live_at = np.zeros(n, dtype=np.int64)
    nlive = 0
    cached = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=np.bool_)
    harm = np.empty((1024, 3), dtype=np.int64)
    nharm = 0
    evictions = 0
    new = np.empty(16, dtype=np.int64)
    mine = np.empty(16, dtype=np.int64)

    for e in range(len(reqs)):
        i = reqs[e]
        if kinds[e] == 0:  # end: blocks back to the free queue, tail first
            m = hn[i]
            stamp += 1
            for t in range(m):
                b = arena[hstart[i] + (m - 1 - t if head_first else t)]
                if seen[b] == stamp:
                    continue
                seen[b] = stamp
                ref[b] -= 1
                if ref[b] == 0:
                    if state[b] == BLANK:
                        blank[sp] = b
                        sp += 1
                    elif kind == LRU:  # at the free queue's tail
                        queue_append(qnext, qprev, inq, qmeta, b)
                    else:
                        k = belady_key(b, bpos[b], static, nxt, shift, top, now)
                        heap = heap_push(heap, hkey, hmeta, k, b, mask)
            last = live[nlive - 1]  # i is not running any more
            live[live_at[i]] = last
            live_at[last] = live_at[i]
            nlive -= 1
            continue

        now = rank[i]
        base = offsets[i]
        nkeys = offsets[i + 1] - base
        p = prompt[i]
        limit = (max(p - 1, 0) // bs) if caching else 0
        limit = min(limit, nkeys)
        if len(mine) < nkeys:
            mine = np.empty(2 * nkeys, dtype=np.int64)
        h = 0
        while h < limit:
            kid = kids[base + h]
            if first[kid] < 0:
                break
            mine[h] = first[kid]
            h += 1
        for t in range(h):  # touched: hit blocks are not evictable while i runs
            b = mine[t]
            if kind == LRU:
                queue_remove(qnext, qprev, inq, qmeta, b)
            else:
                bpos[b] = base + t
                if hkey[b] != -1:
                    hkey[b] = -1
                    hmeta[1] -= 1
        cached[i] = h
        if caching:  # harm: a missed key whose last copy someone evicted, counted by who
            g0 = nharm
            for j in range(h, nkeys):
                kid = kids[base + j]
                if evicted[kid] >= 0 and first[kid] < 0:
                    if nharm == len(harm):
                        bigger = np.empty((2 * nharm, 3), dtype=np.int64)
                        bigger[:nharm] = harm
                        harm = bigger
                    harm[nharm, 0] = i
                    harm[nharm, 1] = evicted[kid]
                    harm[nharm, 2] = 1
                    nharm += 1
            if nharm - g0 > 1:  # one row per (evictor, owner), sorted
                packed = np.sort(harm[g0:nharm, 1])
                nharm = g0
                for t in range(len(packed)):
                    if t and packed[t] == packed[t - 1]:
                        harm[nharm - 1, 2] += 1
                    else:
                        harm[nharm, 0] = i
                        harm[nharm, 1] = packed[t]
                        harm[nharm, 2] = 1
                        nharm += 1
        computed = p + output[i] - 1
        total = -((-computed) // bs)
        full = computed // bs
        need = total - h
        if len(new) < need:
            new = np.empty(2 * need, dtype=np.int64)
        take = min(need, sp)
        for t in range(take):
            new[t] = blank[sp - 1 - t]
        sp -= take
        nn = take
        rest = need - take
        if rest > 0:
            evictable = qmeta[2] if kind == LRU else hmeta[1]
            if rest > evictable:
                preempted[i] = True
                rest = evictable
            for _ in range(rest):  # victims, in the order's order
                if kind == LRU:
                    b = queue_pop(qnext, qprev, inq, qmeta)
                else:
                    b = heap_pop_live(heap, hkey, hmeta, mask)
                evictions += 1
                new[nn] = b
                nn += 1
                if state[b] != KEYED:
                    continue
                kid = kid_of[b]
                if first[kid] == b:
                    nb = dnext[b]
                    if nb >= 0:  # the next block stored with the key takes over
                        first[kid] = nb
                        dprev[nb] = -1
                        dnext[b] = -1
                    else:
                        first[kid] = -1
                        evicted[kid] = (i << 32) + owner_of[b] + 1
                else:  # a later copy: out of the key's list
                    pb, nb = dprev[b], dnext[b]
                    dnext[pb] = nb
                    if nb >= 0:
                        dprev[nb] = pb
                    dprev[b] = -1
                    dnext[b] = -1
        m = h + nn  # held, tail first: new reversed, then mine reversed
        if pos + m > len(arena):  # move the running requests' blocks to the front
            running = live[:nlive][np.argsort(hstart[live[:nlive]])]
            pos = 0
            for r in running:
                for t in range(hn[r]):
                    arena[pos + t] = arena[hstart[r] + t]
                hstart[r] = pos
                pos += hn[r]
            if 2 * (pos + m) > len(arena):
                bigger = np.empty(2 * (pos + m), dtype=np.int32)
                bigger[:pos] = arena[:pos]
                arena = bigger
        off = pos
        hstart[i] = pos
        pos += m
        live[nlive] = i
        live_at[i] = nlive
        nlive += 1
        stamp += 1
        for t in range(m):
            b = new[nn - 1 - t] if t < nn else mine[h - 1 - (t - nn)]
            arena[off + t] = b
            if seen[b] != stamp:
                seen[b] = stamp
                ref[b] += 1
        hn[i] = m
        if nn == 0 or not caching:
            continue
        nk = min(nkeys, h + nn) - h  # new blocks that get a prompt key
        for t in range(nk):
            b = new[t]
            kid = kids[base + h + t]
            if first[kid] >= 0:  # held elsewhere: b is a later copy, at the list's end
                last = first[kid]
                while dnext[last] >= 0:
                    last = dnext[last]
                dnext[last] = b
                dprev[b] = last
            else:
                first[kid] = b
                evicted[kid] = -1
            kid_of[b] = kid
            state[b] = KEYED
            owner_of[b] = i
        nop = max(0, min(full, h + nn) - h - nk)
        for t in range(nk, nn):
            state[new[t]] = OPAQUE if t < nk + nop else BLANK
        if kind == BELADY:  # stored: the new blocks' positions (beyond the keys: none)
            stored = min(nn, offsets[i + 1] - base - h)
            for t in range(nn):
                bpos[new[t]] = base + h + t if t < stored else -1
    return cached, preempted, evictions, harm[:nharm]
