"""vLLM's block pool, fast: the semantics of reference.py with a pluggable eviction order.

Contract: with `LRUOrder` the result equals `reference.simulate_lru` exactly (cached blocks,
harm rows, evictions, preemptions); see reference.py for the rules. Physical block ids may
differ (blank blocks are interchangeable), nothing observable does. With another order only the
choice among evictable hashed blocks changes: blank blocks (no hash) are still reused first,
held blocks are never evicted, a key is looked up in the first block that stored it.

Cost: per request a few C-level calls over its block list (lookup by `map`, reference counts
in numpy, the order's bulk hooks) plus a Python loop over its *missed* blocks only.
"""

from __future__ import annotations

import time

import numpy as np

from kvscope.replay.order import EvictionOrder
from kvscope.replay.result import SimResult
from kvscope.replay.trace import Trace

NO_HASH = -1  # a blank block
OPAQUE = -2  # hashed output block: its content is unknown, no lookup matches it


def event_order(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(request, is_start) per event, in replay order: by time, ends before starts, then index;
    a request without duration (end = start) ends right after its own start."""
    n = len(trace)
    start, end = np.asarray(trace.start_s, float), np.asarray(trace.end_s, float)
    idx = np.concatenate([np.arange(n), np.arange(n)])
    is_start = np.concatenate([np.zeros(n, dtype=np.int8), np.ones(n, dtype=np.int8)])
    tier = np.concatenate([(end <= start).astype(np.int8), np.ones(n, dtype=np.int8)])
    perm = np.lexsort((1 - is_start, idx, tier, np.concatenate([end, start])))
    return idx[perm], is_start[perm]


def start_rank(trace: Trace) -> np.ndarray:
    """rank[i]: request i's position among starts (the replay's clock for next-use policies)."""
    order = np.lexsort((np.arange(len(trace)), np.asarray(trace.start_s, float)))
    rank = np.empty(len(trace), dtype=np.int64)
    rank[order] = np.arange(len(trace))
    return rank


def harm_arrays(harm: dict[tuple[int, int, int], int]) -> dict[str, np.ndarray]:
    rows = sorted(harm.items())
    return {
        "harm_request": np.array([r[0][0] for r in rows], dtype=np.int64),
        "harm_evictor": np.array([r[0][1] for r in rows], dtype=np.int64),
        "harm_owner": np.array([r[0][2] for r in rows], dtype=np.int64),
        "harm_blocks": np.array([r[1] for r in rows], dtype=np.int64),
    }


def simulate_pool(
    trace: Trace, capacity_blocks: int, order: EvictionOrder, *, caching: bool = True
) -> SimResult:
    """Replay `trace` through a vLLM block pool of `capacity_blocks` usable blocks.

    `caching=False` is the no-cache counterfactual: nothing is looked up or kept.
    """
    started = time.perf_counter()
    n, bs = len(trace), trace.block_size
    order.bind(trace, capacity_blocks, start_rank(trace))
    ref = np.zeros(capacity_blocks, dtype=np.int64)
    key_of = [NO_HASH] * capacity_blocks
    owner_of = [-1] * capacity_blocks
    blank = list(range(capacity_blocks - 1, -1, -1))  # free blocks without a hash (a stack)
    index: dict[int, int] = {}  # key -> first block that stored it
    dups: dict[int, list[int]] = {}  # key -> later blocks holding it, in the order stored
    evicted_by: dict[int, int] = {}  # key -> evictor << 32 | (owner + 1), until stored again
    held: dict[int, list[int]] = {}
    cached = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=bool)
    harm: dict[tuple[int, int, int], int] = {}
    evictions = 0
    prompt = trace.prompt_tokens.tolist()
    output = trace.output_tokens.tolist()
    offsets = trace.offsets.tolist()
    keys_all = trace.keys
    index_get, evicted_get = index.get, evicted_by.get

    reqs, kinds = event_order(trace)
    for i, kind in zip(reqs.tolist(), kinds.tolist(), strict=True):
        if kind == 0:  # end
            mine = held.pop(i, None)
            if not mine:
                order.finished(i)
                continue
            arr = np.array(mine[::-1], dtype=np.int64)
            ref[arr] -= 1
            freed = arr[ref[arr] == 0].tolist()
            hashed = [b for b in freed if key_of[b] != NO_HASH]
            if len(hashed) != len(freed):
                blank.extend(b for b in freed if key_of[b] == NO_HASH)
            if hashed:
                order.released(i, hashed)
            order.finished(i)
            continue

        order.start(i)
        keys = keys_all[offsets[i] : offsets[i + 1]].tolist()
        p = prompt[i]
        limit = max(p - 1, 0) // bs if caching else 0
        hits = list(map(index_get, keys[:limit]))
        h = hits.index(None) if None in hits else len(hits)
        mine = hits[:h]
        if h:
            order.touched(i, mine)
            ref[mine] += 1
        cached[i] = h
        if evicted_by:
            for k in keys[h:]:
                e = evicted_get(k)
                if e is not None and k not in index:
                    row = (i, e >> 32, (e & 0xFFFFFFFF) - 1)
                    harm[row] = harm.get(row, 0) + 1
        computed = p + output[i] - 1
        total, full = -(-computed // bs), computed // bs
        need = total - h
        take = min(need, len(blank))
        new = blank[len(blank) - take :][::-1] if take else []
        del blank[len(blank) - take :]
        while len(new) < need:
            if not len(order):
                preempted[i] = True
                break
            b = order.pop()
            k = key_of[b]
            if k >= 0:
                if index[k] == b:
                    d = dups.get(k)
                    if d:
                        index[k] = d.pop(0)
                        if not d:
                            del dups[k]
                    else:
                        del index[k]
                        evicted_by[k] = (i << 32) | (owner_of[b] + 1)
                else:
                    d = dups[k]
                    d.remove(b)
                    if not d:
                        del dups[k]
            key_of[b] = NO_HASH
            evictions += 1
            new.append(b)
        if new:
            ref[new] += 1
        nk = len(keys) if caching else 0
        for j, b in enumerate(new, h):
            if j < nk:
                k = keys[j]
                if k in index:
                    dups.setdefault(k, []).append(b)
                else:
                    index[k] = b
                    if evicted_by:
                        evicted_by.pop(k, None)
                key_of[b] = k
                owner_of[b] = i
            elif j < full and caching:
                key_of[b] = OPAQUE
            else:
                break
        if new and caching:
            order.stored(i, new, h)
        held[i] = mine + new

    return SimResult(
        policy=order.name if caching else "none",
        capacity_blocks=capacity_blocks,
        block_size=bs,
        cached_blocks=cached,
        host_blocks=np.zeros(n, dtype=np.int64),
        preempted=preempted,
        evictions=evictions,
        seconds=time.perf_counter() - started,
        **harm_arrays(harm),
    )
