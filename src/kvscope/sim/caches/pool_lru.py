"""vLLM's block pool under LRU, compiled: pool.py's rules in one numba kernel.

`simulate_pool` (pool.py) calls `simulate_lru_pool` for the LRU order (and for no cache) without
a host tier. The rules are pool.py's docstring, replayed event by event in machine code: the free
queue a doubly linked list over block ids, the blank blocks a stack, the keys as dense ids
(key_ids.py, once per trace) so the key index is two arrays by id (the first block holding the
key, who evicted its last copy), later blocks holding the same key a linked list per key in the
order stored, each running request's blocks in a flat arena (as large as the blocks running
requests hold at once).

Contract: the same SimResult as pool.py's Python path with `LRUOrder` (cached blocks,
preemptions, evictions, harm rows), which tests/unit/sim holds on random traces, duplicate keys,
preemption, head-first order and no cache. Only `seconds` differs.

Cost: compiled on first use and kept on disk (compiled.py); then a replay is the load of the
cached code (~0.3-0.5 s), the keys' factorization once per trace and one pass over the events per
capacity (measured in README's What-if replay section).
"""

from __future__ import annotations

import time

import numpy as np

from kvscope.sim.caches.compiled import compiled
from kvscope.sim.caches.key_ids import key_ids
from kvscope.sim.caches.result import SimResult
from kvscope.sim.caches.states import BLANK, KEYED, OPAQUE
from kvscope.sim.trace import Trace


def simulate_lru_pool(
    trace: Trace,
    capacity_blocks: int,
    reqs: np.ndarray,
    kinds: np.ndarray,
    *,
    caching: bool = True,
    head_first: bool = False,
) -> SimResult:
    """pool.py's `simulate_pool(trace, capacity_blocks, LRUOrder(), caching=..., head_first=...)`
    with the events `reqs`/`kinds` (pool.event_order)."""
    started = time.perf_counter()
    n, bs = len(trace), trace.block_size
    prompt = np.ascontiguousarray(trace.prompt_tokens, dtype=np.int64)
    output = np.ascontiguousarray(trace.output_tokens, dtype=np.int64)
    cached, preempted, evictions, harm = _replay(
        np.ascontiguousarray(reqs, dtype=np.int64),
        np.ascontiguousarray(kinds, dtype=np.int8),
        prompt,
        output,
        np.ascontiguousarray(trace.offsets, dtype=np.int64),
        *key_ids(trace.keys),
        np.int64(bs),
        np.int64(capacity_blocks),
        caching,
        head_first,
    )
    return SimResult(
        policy="lru" if caching else "none",
        capacity_blocks=capacity_blocks,
        block_size=bs,
        cached_blocks=cached,
        host_blocks=np.zeros(n, dtype=np.int64),
        prefetched_blocks=None,
        preempted=preempted,
        evictions=int(evictions),
        seconds=time.perf_counter() - started,
        **_harm_rows(harm),
    )


def warm(trace: Trace) -> None:
    """Load the compiled code and factorize `trace`'s keys now (simulate.prepare)."""
    key_ids(trace.keys)
    one = np.zeros(1, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    _replay(empty, empty.astype(np.int8), empty, empty, one, empty.astype(np.int32), 0,
            np.int64(1), np.int64(1), True, False)  # fmt: skip


def _harm_rows(harm: np.ndarray) -> dict[str, np.ndarray]:
    """The kernel's (request, evictor << 32 | (owner + 1), blocks) rows, distinct within a
    request -> pool.harm_arrays' rows, sorted by (request, evictor, owner)."""
    harm = harm[np.lexsort((harm[:, 1], harm[:, 0]))]
    return {
        "harm_request": harm[:, 0].copy(),
        "harm_evictor": harm[:, 1] >> 32,
        "harm_owner": (harm[:, 1] & 0xFFFFFFFF) - 1,
        "harm_blocks": harm[:, 2].copy(),
    }


@compiled()
def _replay(
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
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """pool.py's replay over dense key ids: (cached blocks, preempted, evictions, harm rows
    (request, evictor << 32 | (owner + 1), blocks), counted within each request)."""
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
    qnext = np.full(cap, -1, dtype=np.int64)  # the free queue: head evicted first
    qprev = np.full(cap, -1, dtype=np.int64)
    inq = np.zeros(cap, dtype=np.bool_)
    qhead, qtail, qlen = -1, -1, 0
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
                    else:  # append at the tail
                        qprev[b] = qtail
                        qnext[b] = -1
                        if qtail >= 0:
                            qnext[qtail] = b
                        else:
                            qhead = b
                        qtail = b
                        inq[b] = True
                        qlen += 1
            last = live[nlive - 1]  # i is not running any more
            live[live_at[i]] = last
            live_at[last] = live_at[i]
            nlive -= 1
            continue

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
        for t in range(h):  # touched: hit blocks leave the free queue
            b = mine[t]
            if inq[b]:
                inq[b] = False
                if qprev[b] >= 0:
                    qnext[qprev[b]] = qnext[b]
                else:
                    qhead = qnext[b]
                if qnext[b] >= 0:
                    qprev[qnext[b]] = qprev[b]
                else:
                    qtail = qprev[b]
                qlen -= 1
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
            if rest > qlen:
                preempted[i] = True
                rest = qlen
            for _ in range(rest):  # victims from the head of the free queue
                b = qhead
                qhead = qnext[b]
                if qhead >= 0:
                    qprev[qhead] = -1
                else:
                    qtail = -1
                inq[b] = False
                qlen -= 1
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
    return cached, preempted, evictions, harm[:nharm]
