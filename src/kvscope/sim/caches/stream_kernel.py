"""vLLM's block pool under LRU, compiled and resumable: pool_kernel.py's `replay` a chunk of
events at a time, its state kept between calls (caches/streamed.py drives it).

The rules and their order are pool_kernel.py's for LRU; what differs is where the state lives:
- keys are the trace's uint64 keys, not dense ids: `first` (a key's first block in the cache)
  is an open-addressing table holding only the keys that are in the cache (a key leaves it when
  its last copy is evicted: backward-shift deletion), and `evicted` (who evicted a key's last
  copy: evictor << 32 | (owner + 1); -1 once stored again) a table of the keys ever evicted, so
  memory follows the cache and the keys evicted, not the trace;
- blocks never used are not materialized: blank blocks are the returned ones (a stack) and then
  `fresh` ones, in the order pool_kernel's initial stack hands them out, so the per-block arrays
  grow with the blocks used (the caller sizes them before each chunk, `need_blocks`);
- a request's global index (its rank among starts) names it in the per-request arrays the caller
  grows; a chunk's prompt lengths and keys are the chunk's own.

Everything the kernels call is in this file (numba's disk cache checks only the compiled
function's file). Tables are kept at most half full by the caller (`grow_table`).
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import compiled
from kvscope.sim.caches.states import BLANK, KEYED, OPAQUE

# scalars kept between chunks (`sc`)
SP, FRESH, STAMP, NLIVE, POS, EVICTIONS, HEAD, TAIL, QLEN, NFIRST, NEVICTED = range(11)
SCALARS = 11


@compiled(inline="always")
def _slot(key: np.uint64, mask: np.int64) -> np.int64:
    """Start slot of `key` (splitmix64's finalizer)."""
    z = key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z & np.uint64(mask))


@compiled(inline="always")
def find_slot(tkey: np.ndarray, tval: np.ndarray, key: np.uint64) -> np.int64:
    """The slot of `key`, or the empty slot (tval -2) where it would go."""
    mask = len(tkey) - 1
    s = _slot(key, mask)
    while tval[s] != -2 and tkey[s] != key:
        s = (s + 1) & mask
    return s


@compiled(inline="always")
def delete_slot(tkey: np.ndarray, tval: np.ndarray, s: np.int64) -> None:
    """Empty slot s, shifting back the entries after it that may not stay past a hole."""
    mask = len(tkey) - 1
    j = s
    while True:
        j = (j + 1) & mask
        if tval[j] == -2:
            break
        h = _slot(tkey[j], mask)
        stays = (s < h and h <= j) if s < j else (h > s or h <= j)
        if not stays:
            tkey[s] = tkey[j]
            tval[s] = tval[j]
            s = j
    tval[s] = -2


@compiled()
def grow_table(tkey: np.ndarray, tval: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The table's entries placed in a table of `size` slots (a power of two)."""
    nkey = np.zeros(size, dtype=np.uint64)
    nval = np.full(size, -2, dtype=np.int64)
    for t in range(len(tkey)):
        if tval[t] != -2:
            s = find_slot(nkey, nval, tkey[t])
            nkey[s] = tkey[t]
            nval[s] = tval[t]
    return nkey, nval


@compiled(inline="always")
def _queue_remove(
    nxt: np.ndarray, prv: np.ndarray, inq: np.ndarray, sc: np.ndarray, b: np.int64
) -> None:
    if not inq[b]:
        return
    inq[b] = False
    if prv[b] >= 0:
        nxt[prv[b]] = nxt[b]
    else:
        sc[HEAD] = nxt[b]
    if nxt[b] >= 0:
        prv[nxt[b]] = prv[b]
    else:
        sc[TAIL] = prv[b]
    sc[QLEN] -= 1


@compiled(inline="always")
def _queue_append(
    nxt: np.ndarray, prv: np.ndarray, inq: np.ndarray, sc: np.ndarray, b: np.int64
) -> None:
    prv[b] = sc[TAIL]
    nxt[b] = -1
    if sc[TAIL] >= 0:
        nxt[sc[TAIL]] = b
    else:
        sc[HEAD] = b
    sc[TAIL] = b
    inq[b] = True
    sc[QLEN] += 1


@compiled()
def run_chunk(
    reqs: np.ndarray,
    kinds: np.ndarray,
    base: int,
    prompt: np.ndarray,
    output: np.ndarray,
    offsets: np.ndarray,
    keys: np.ndarray,
    bs: int,
    cap: int,
    head_first: bool,
    attribute: bool,
    sc: np.ndarray,
    blocks: tuple,
    first_key: np.ndarray,
    first_val: np.ndarray,
    ev_key: np.ndarray,
    ev_val: np.ndarray,
    arena: np.ndarray,
    running: tuple,
    cached: np.ndarray,
    preempted: np.ndarray,
    harm: np.ndarray,
) -> tuple[np.ndarray, np.int64]:
    """One chunk's events (request, 1 start / 0 end; requests named by global index, a start's
    request at `base` + its place in the chunk's prompt/output/offsets/keys): cached blocks and
    preemption of its requests into `cached`, `preempted` (by place in the chunk), its harm rows
    into `harm` (`attribute` False: none, and no evicted key is kept). Returns the arena (a new
    array when it grew) and the harm rows written."""
    blank, ref, state, key_of, owner_of, dnext, dprev, seen, qnext, qprev, inq = blocks
    hstart, hn, live, live_at = running
    nharm = 0
    new = np.empty(16, dtype=np.int64)
    mine = np.empty(16, dtype=np.int64)
    for e in range(len(reqs)):
        i = reqs[e]
        if kinds[e] == 0:  # end: blocks back to the free queue, tail first
            m = hn[i]
            sc[STAMP] += 1
            stamp = sc[STAMP]
            for t in range(m):
                b = arena[hstart[i] + (m - 1 - t if head_first else t)]
                if seen[b] == stamp:
                    continue
                seen[b] = stamp
                ref[b] -= 1
                if ref[b] == 0:
                    if state[b] == BLANK:
                        blank[sc[SP]] = b
                        sc[SP] += 1
                    else:
                        _queue_append(qnext, qprev, inq, sc, b)
            nlive = sc[NLIVE]
            last = live[nlive - 1]
            live[live_at[i]] = last
            live_at[last] = live_at[i]
            sc[NLIVE] = nlive - 1
            continue

        c = i - base
        lo = offsets[c]
        nkeys = offsets[c + 1] - lo
        p = prompt[c]
        limit = min(max(p - 1, 0) // bs, nkeys)
        if len(mine) < nkeys:
            mine = np.empty(2 * nkeys, dtype=np.int64)
        h = 0
        while h < limit:
            s = find_slot(first_key, first_val, keys[lo + h])
            if first_val[s] == -2:
                break
            mine[h] = first_val[s]
            h += 1
        for t in range(h):  # touched: hit blocks are not evictable while i runs
            _queue_remove(qnext, qprev, inq, sc, mine[t])
        cached[c] = h
        g0 = nharm  # harm: a missed key whose last copy someone evicted, counted by who
        for j in range(h, nkeys if attribute else h):
            key = keys[lo + j]
            if first_val[find_slot(first_key, first_val, key)] != -2:
                continue
            s = find_slot(ev_key, ev_val, key)
            if ev_val[s] >= 0:
                harm[nharm, 0] = i
                harm[nharm, 1] = ev_val[s]
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
        computed = p + output[c] - 1
        total = -((-computed) // bs)
        full = computed // bs
        need = total - h
        if len(new) < need:
            new = np.empty(2 * need, dtype=np.int64)
        nn = 0
        while nn < need and sc[SP] > 0:  # blank blocks: the returned ones, then fresh ones
            sc[SP] -= 1
            new[nn] = blank[sc[SP]]
            nn += 1
        while nn < need and sc[FRESH] < cap:
            new[nn] = sc[FRESH]
            sc[FRESH] += 1
            nn += 1
        rest = need - nn
        if rest > 0:
            if rest > sc[QLEN]:
                preempted[c] = True
                rest = sc[QLEN]
            for _ in range(rest):  # victims from the free queue's head
                b = sc[HEAD]
                sc[HEAD] = qnext[b]
                if sc[HEAD] >= 0:
                    qprev[sc[HEAD]] = -1
                else:
                    sc[TAIL] = -1
                inq[b] = False
                sc[QLEN] -= 1
                sc[EVICTIONS] += 1
                new[nn] = b
                nn += 1
                if state[b] != KEYED:
                    continue
                key = key_of[b]
                s = find_slot(first_key, first_val, key)
                if first_val[s] == b:
                    nb = dnext[b]
                    if nb >= 0:  # the next block stored with the key takes over
                        first_val[s] = nb
                        dprev[nb] = -1
                        dnext[b] = -1
                    else:
                        delete_slot(first_key, first_val, s)
                        sc[NFIRST] -= 1
                        if not attribute:
                            continue
                        v = find_slot(ev_key, ev_val, key)
                        if ev_val[v] == -2:
                            ev_key[v] = key
                            sc[NEVICTED] += 1
                        ev_val[v] = (i << 32) + owner_of[b] + 1
                else:  # a later copy: out of the key's list
                    pb, nb = dprev[b], dnext[b]
                    dnext[pb] = nb
                    if nb >= 0:
                        dprev[nb] = pb
                    dprev[b] = -1
                    dnext[b] = -1
        m = h + nn  # held, tail first: new reversed, then mine reversed
        pos = sc[POS]
        nlive = sc[NLIVE]
        if pos + m > len(arena):  # move the running requests' blocks to the front
            order = live[:nlive][np.argsort(hstart[live[:nlive]])]
            pos = 0
            for r in order:
                for t in range(hn[r]):
                    arena[pos + t] = arena[hstart[r] + t]
                hstart[r] = pos
                pos += hn[r]
            if 2 * (pos + m) > len(arena):
                bigger = np.empty(2 * (pos + m), dtype=np.int32)
                bigger[:pos] = arena[:pos]
                arena = bigger
        hstart[i] = pos
        sc[POS] = pos + m
        live[nlive] = i
        live_at[i] = nlive
        sc[NLIVE] = nlive + 1
        sc[STAMP] += 1
        stamp = sc[STAMP]
        for t in range(m):
            b = new[nn - 1 - t] if t < nn else mine[h - 1 - (t - nn)]
            arena[pos + t] = b
            if seen[b] != stamp:
                seen[b] = stamp
                ref[b] += 1
        hn[i] = m
        if nn == 0:
            continue
        nk = min(nkeys, h + nn) - h  # new blocks that get a prompt key
        for t in range(nk):
            b = new[t]
            key = keys[lo + h + t]
            s = find_slot(first_key, first_val, key)
            if first_val[s] != -2:  # held elsewhere: b is a later copy, at the list's end
                last = first_val[s]
                while dnext[last] >= 0:
                    last = dnext[last]
                dnext[last] = b
                dprev[b] = last
            else:
                first_key[s] = key
                first_val[s] = b
                sc[NFIRST] += 1
                if attribute:
                    v = find_slot(ev_key, ev_val, key)
                    if ev_val[v] != -2:
                        ev_val[v] = -1
            key_of[b] = key
            state[b] = KEYED
            owner_of[b] = i
        nop = max(0, min(full, h + nn) - h - nk)
        for t in range(nk, nn):
            state[new[t]] = OPAQUE if t < nk + nop else BLANK
    return arena, nharm
