"""A plain, slow, obviously-faithful replay of vLLM's prefix cache: the oracle the fast one
(kvscope.sim.caches.pool) is tested against. The rules it replays, and the evidence for them,
are pool.py's docstring."""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict

import numpy as np

from kvscope.sim.caches.result import SimResult
from kvscope.sim.trace import Trace


def simulate_lru(trace: Trace, capacity_blocks: int) -> SimResult:
    started = time.perf_counter()
    n, bs = len(trace), trace.block_size
    free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(capacity_blocks))
    key_of: dict[int, int | None] = {}  # hashed physical block -> key (None: opaque output hash)
    blocks_of_key: dict[int, dict[int, None]] = defaultdict(dict)  # in the order stored
    owner_of: dict[int, int] = {}  # physical block -> request that stored its key
    ref = [0] * capacity_blocks
    held: dict[int, list[int]] = {}
    evicted_by: dict[int, tuple[int, int]] = {}  # key -> (evictor, owner), until stored again
    cached = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=bool)
    harm: dict[tuple[int, int, int], int] = defaultdict(int)
    evictions = 0

    events = sorted(
        [(float(trace.start_s[i]), 1, i, 0) for i in range(n)]
        + [
            (float(trace.end_s[i]), 0 if trace.end_s[i] > trace.start_s[i] else 1, i, 1)
            for i in range(n)
        ]
    )
    for _, _, i, is_end in events:
        kind = 0 if is_end else 1
        if kind == 0:  # end: release in reverse order
            unhashed: list[int] = []
            for b in reversed(held.pop(i, [])):
                ref[b] -= 1
                if ref[b] == 0:
                    if b in key_of:
                        free[b] = None
                    else:
                        unhashed.append(b)
            for b in reversed(unhashed):  # prepend_n: the list lands at the head in its order
                free[b] = None
                free.move_to_end(b, last=False)
            continue
        keys = [int(k) for k in trace.blocks_of(i)]
        limit = max(int(trace.prompt_tokens[i]) - 1, 0) // bs
        mine: list[int] = []
        for k in keys[:limit]:
            hit = blocks_of_key.get(k)
            if not hit:
                break
            b = next(iter(hit))
            if ref[b] == 0:
                free.pop(b)
            ref[b] += 1
            mine.append(b)
        cached[i] = len(mine)
        for k in keys[len(mine) :]:
            if k in evicted_by and k not in blocks_of_key:
                evictor, owner = evicted_by[k]
                harm[(i, evictor, owner)] += 1
        computed = int(trace.prompt_tokens[i]) + int(trace.output_tokens[i]) - 1
        total, full = -(-computed // bs), computed // bs
        for j in range(len(mine), total):
            if not free:
                preempted[i] = True
                break
            b, _ = free.popitem(last=False)
            if b in key_of:  # eviction
                k = key_of.pop(b)
                if k is not None:
                    blocks_of_key[k].pop(b, None)
                    if not blocks_of_key[k]:
                        del blocks_of_key[k]
                        evicted_by[k] = (i, owner_of.get(b, -1))
                evictions += 1
            ref[b] += 1
            mine.append(b)
            if j < len(keys):
                key_of[b] = keys[j]
                blocks_of_key[keys[j]][b] = None
                owner_of[b] = i
                evicted_by.pop(keys[j], None)
            elif j < full:
                key_of[b] = None
        held[i] = mine

    rows = sorted(harm.items())
    return SimResult(
        policy="lru",
        capacity_blocks=capacity_blocks,
        block_size=bs,
        cached_blocks=cached,
        host_blocks=np.zeros(n, dtype=np.int64),
        preempted=preempted,
        harm_request=np.array([r[0][0] for r in rows], dtype=np.int64),
        harm_evictor=np.array([r[0][1] for r in rows], dtype=np.int64),
        harm_owner=np.array([r[0][2] for r in rows], dtype=np.int64),
        harm_blocks=np.array([r[1] for r in rows], dtype=np.int64),
        evictions=evictions,
        seconds=time.perf_counter() - started,
    )
