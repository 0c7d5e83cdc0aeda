"""LRU at many capacities in one pass: Mattson's stack distances over vLLM's block pool.

    results, why = lru_sweep(trace, [1280, 2560, 5120])   # {capacity_blocks: SimResult}, reason

An LRU cache of C blocks holds the C most recently used keys, whatever C is (the inclusion
property): one pass that knows, for each request, how deep each of its keys lies in the LRU
stack gives the hits of every capacity at once. vLLM's block pool (pool.py) is such a stack over
keys exactly when every block it holds carries one distinct prompt key and nothing else decides
which block goes, i.e. where all of the following hold, checked here:

- prompt-only caching (`trace` is `prompt_only`'s: a request takes exactly its full prompt
  blocks, each keyed), tail-first in-request order, no host tier (simulate.py decides those);
- requests do not overlap in time (each ends before the next starts: no running request pins
  blocks), and no request repeats a key within its prompt;
- per capacity: no request needs more blocks than the capacity (no preemption), and no key that
  a request cannot hit is still cached when it asks (a key beyond its first miss, or its last
  full block when the prompt is whole blocks, which vLLM recomputes: the pool then holds two
  copies of the key and stops being a stack over keys).

Where a condition fails the capacity (or the whole sweep) is not answered here: `why` says
which, and the caller simulates those capacities one by one. Where they hold, each SimResult
equals `simulate_pool(trace, C, LRUOrder())`'s exactly: cached blocks per request, evictions,
harm rows (evictor: the request whose allocation pushed the key below depth C; owner: the last
request that missed it at C, i.e. stored it), nothing preempted.

Cost: one loop over requests, each a few numpy calls over its keys x the capacities; the stack
is a sorted array of the last-use times of the `max(capacities)` most recent keys (deeper keys
miss at every capacity asked), so its work does not grow with the number of capacities beyond
the (keys x capacities) masks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from kvscope.sim.caches.pool import event_order
from kvscope.sim.caches.result import SimResult
from kvscope.sim.trace import Trace

DEEP = np.iinfo(np.int64).max  # the depth of a key not in the stack (cold or below max(C))


def sequential_order(trace: Trace) -> np.ndarray | None:
    """The requests in replay order when none overlaps another (each ends before the next
    starts, in pool.event_order's order); None when two overlap."""
    reqs, kinds = event_order(trace)
    if len(reqs) == 0:
        return reqs
    starts, ends = reqs[0::2], reqs[1::2]
    if (kinds[0::2] == 1).all() and (kinds[1::2] == 0).all() and (starts == ends).all():
        return starts
    return None


def whole_blocks(trace: Trace) -> bool:
    """Every request takes exactly its keyed prompt blocks (prompt_only's trace)."""
    computed = trace.prompt_tokens + trace.output_tokens - 1
    taken = np.maximum(-(-computed // trace.block_size), 0)
    return bool((taken == np.diff(trace.offsets)).all())


def lru_sweep(
    trace: Trace, capacities: Sequence[int], *, head_first: bool = False
) -> tuple[dict[int, SimResult], dict[int, str]]:
    """LRU at every capacity (blocks) of `capacities` where the stack is exact (module doc):
    ({capacity: SimResult}, {capacity: why it is simulated apart instead}).
    `trace` must be the prompt-only trace the pool would replay; `head_first`: a request's
    first block is the least recent of its blocks (pool.py's head_first), not its last."""
    started = time.perf_counter()
    caps = sorted(set(int(c) for c in capacities))
    why: dict[int, str] = {}
    order = sequential_order(trace)
    if order is None:
        return {}, dict.fromkeys(caps, "requests overlap in time (running requests pin blocks)")
    if not whole_blocks(trace):
        return {}, dict.fromkeys(caps, "a request takes blocks without a prompt key")
    counts = np.diff(trace.offsets)
    biggest = int(counts.max()) if len(counts) else 0
    for c in caps:
        if c < max(biggest, 1):
            why[c] = f"a request needs {biggest} blocks, more than {c} (it would be preempted)"
    exact = np.array([c for c in caps if c not in why], dtype=np.int64)
    if not len(exact):
        return {}, why
    out = _run(trace, order, exact, head_first)
    if out is None:
        return {}, dict.fromkeys(caps, "a request repeats a key in its prompt")
    cached, evictions, harm, broken = out
    seconds = time.perf_counter() - started
    results: dict[int, SimResult] = {}
    n = len(trace)
    for k, c in enumerate(exact.tolist()):
        if broken[k]:
            why[c] = "a key a request cannot hit was still cached (two copies in the pool)"
            continue
        results[c] = SimResult(
            policy="lru",
            capacity_blocks=c,
            block_size=trace.block_size,
            cached_blocks=cached[:, k].copy(),
            host_blocks=np.zeros(n, dtype=np.int64),
            preempted=np.zeros(n, dtype=bool),
            evictions=int(evictions[k]),
            seconds=seconds,
            **harm[k],
        )
    return results, why


def _run(
    trace: Trace, order: np.ndarray, caps: np.ndarray, head_first: bool
) -> tuple[np.ndarray, np.ndarray, list[dict[str, np.ndarray]], np.ndarray] | None:
    """The pass: per request (in `order`) its hits at each capacity, and what the harm rows
    need; None when a request repeats a key.

    Per request, with `depth[j]` the LRU depth of its key j when it asks (DEEP: never used, or
    below max(caps)): its hits at capacity C are the keys before the first one deeper than C
    (and before its hit limit), `h[C]`; its key j is stored new at the `s[j]` smallest
    capacities (those with h <= j: nested, since h grows with C)."""
    n, bs, nc = len(trace), trace.block_size, len(caps)
    cmax = int(caps.max())
    keys_all, offsets = trace.keys, trace.offsets.tolist()
    limits = (np.maximum(trace.prompt_tokens - 1, 0) // bs).tolist()
    slot: dict[int, int] = {}  # key -> dense id
    slot_get = slot.get
    size = 1 << 16
    last = np.full(size, -1, dtype=np.int64)  # dense id -> last-use time (-1: never)
    owner = np.full((size, nc), -1, dtype=np.int32)  # dense id -> request that stored it, per C
    # the last-use times of the cmax most recent keys, sorted: buf[a:b] (appended at b, trimmed
    # at a, compacted in place from the first key a request takes out: near the top, mostly)
    span = np.arange(int(np.diff(trace.offsets).max(initial=0)) + 1)
    buf = np.zeros(4 * cmax + 2 * len(span), dtype=np.int64)
    a = b = 0
    clock = fresh = 0
    cached = np.zeros((n, nc), dtype=np.int64)
    used = np.zeros(nc, dtype=np.int64)  # blocks holding a key, per capacity
    evictions = np.zeros(nc, dtype=np.int64)
    broken = np.zeros(nc, dtype=bool)
    bound = np.full((n, nc), -1, dtype=np.int64)  # per step: last-use time at depth C after it
    rows: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []  # harm candidates
    cols = np.arange(nc)[None, :]
    sentinel = np.array([DEEP])
    for step, i in enumerate(order.tolist()):
        lo, hi = offsets[i], offsets[i + 1]
        m = hi - lo
        if m:
            keys = keys_all[lo:hi].tolist()
            if len(set(keys)) != m:
                return None
            ids = np.fromiter(map(slot_get, keys, repeat(-1)), dtype=np.int64, count=m)
            new = np.flatnonzero(ids < 0)
            if len(new):
                ids[new] = span[: len(new)] + fresh
                slot.update(zip([keys[j] for j in new.tolist()], ids[new].tolist(), strict=True))
                fresh += len(new)
                if fresh > len(last):
                    grow = max(len(last), fresh - len(last))
                    last = np.concatenate([last, np.full(grow, -1, dtype=np.int64)])
                    owner = np.concatenate([owner, np.full((grow, nc), -1, dtype=np.int32)])
            t = last[ids]
            seen = t >= 0
            live = buf[a:b]
            inside = seen & (t >= (buf[a] if b > a else clock))
            pos = np.searchsorted(live, t[inside])
            depth = np.full(m, DEEP, dtype=np.int64)
            depth[inside] = (b - a) - pos
            lim = limits[i]
            if lim:
                h = np.searchsorted(np.maximum.accumulate(depth[:lim]), caps, side="right")
            else:
                h = np.zeros(nc, dtype=np.int64)
            cached[i] = h
            tail_min = np.minimum.accumulate(np.concatenate([depth, sentinel])[::-1])[::-1]
            broken |= tail_min[h] <= caps  # a key it cannot hit is still cached
            if broken.all():
                break  # no capacity is a stack any more: the caller simulates them all
            stored = np.searchsorted(h, span[:m], side="right")  # s[j]
            took = m - h
            evictions += np.maximum(used + took - caps, 0)
            used = np.minimum(used + took, caps)
            new_at = np.flatnonzero(stored)
            if len(new_at):
                rid, s = ids[new_at], stored[new_at]
                own = owner[rid]
                harmed = seen[new_at]
                if harmed.any():
                    rows.append((i, s[harmed], t[new_at][harmed], own[harmed]))
                own[cols < s[:, None]] = i
                owner[rid] = own
            if len(pos):  # its keys leave their places (they go on top below)
                first = int(pos.min())
                keep = np.ones(b - a - first, dtype=bool)
                keep[pos - first] = False
                kept = buf[a + first : b][keep]
                b = a + first + len(kept)
                buf[a + first : b] = kept
            # tail first: the last block is the least recent; head first: the first
            last[ids] = clock + (span[:m] if head_first else m - 1 - span[:m])
            if b + m > len(buf):
                buf[: b - a] = buf[a:b].copy()
                a, b = 0, b - a
            buf[b : b + m] = span[:m] + clock
            b += m
            a = max(a, b - cmax)
            clock += m
        full = b - a >= caps
        bound[step, full] = buf[b - caps[full]]
    return cached, evictions, _harm(rows, bound, order, nc), broken


def _harm(
    rows: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
    bound: np.ndarray,
    order: np.ndarray,
    nc: int,
) -> list[dict[str, np.ndarray]]:
    """Harm rows per capacity, as pool.harm_arrays makes them: a request's key stored new at the
    k smallest capacities that it had used before. Its owner: the request that last stored it
    at that capacity. Its evictor: a key last used at time t left capacity C in the first step
    after which the depth-C bound passed t (the bound only rises while requests take whole
    blocks and none needs more than C)."""
    if rows:
        req = np.concatenate([np.full(len(r[1]), r[0], dtype=np.int64) for r in rows])
        stored = np.concatenate([r[1] for r in rows])
        t = np.concatenate([r[2] for r in rows])
        own = np.concatenate([r[3] for r in rows])  # int32, a column at a time to int64
    else:
        req = stored = t = np.zeros(0, dtype=np.int64)
        own = np.zeros((0, nc), dtype=np.int64)
    out = []
    for k in range(nc):
        pick = stored > k
        step = np.searchsorted(bound[:, k], t[pick], side="right")
        evictor = order[np.minimum(step, len(order) - 1)]
        uniq, blocks = _count_rows(req[pick], evictor, own[pick, k].astype(np.int64), len(order))
        out.append(
            {
                "harm_request": uniq[:, 0].astype(np.int64),
                "harm_evictor": uniq[:, 1].astype(np.int64),
                "harm_owner": uniq[:, 2].astype(np.int64),
                "harm_blocks": blocks.astype(np.int64),
            }
        )
    return out


def _count_rows(
    req: np.ndarray, evictor: np.ndarray, owner: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (request, evictor, owner) rows, sorted, and how often each occurs. Packed
    into one int64 per row when request indices fit 21 bits (a 1-D sort), else sorted as rows."""
    if n < 1 << 20:
        packed = (req << 42) | (evictor << 21) | (owner + 1)
        keys, counts = np.unique(packed, return_counts=True)
        mask = (1 << 21) - 1
        rows = np.stack([keys >> 42, (keys >> 21) & mask, (keys & mask) - 1], axis=1)
        return rows, counts
    table = np.stack([req, evictor, owner], axis=1)
    rows, counts = np.unique(table, axis=0, return_counts=True)
    return rows.reshape(-1, 3), counts
