"""Reference oracle for kvscope.replay.radix: the radix cache as first written, one dict per
node field keyed by page key (slow, plain). Tests require the flat-slot engine to give the
same results on random traces.

SGLang's radix cache: a tree of pages (page size = the trace's block size), leaves evicted.

Contract, as replayed:
- A node is a cached page keyed by its chained block key; its parent is the previous block of
  the chain (the root for the first). A page whose child is cached is not evictable, nor is a
  page locked by a running request (SGLang's lock_ref, held on the whole matched path).
- A request matches its keys in order, at most (prompt - 1) // page_size pages (the last token
  is computed); it needs ceil((prompt + output - 1) / page_size) pages in all, the matched ones
  included. Its prompt pages that are not in the tree are inserted at once, locked; prompt pages
  the tree already has past the match limit are locked, not duplicated (SGLang frees the
  duplicate KV right after prefill; here it is never taken). The rest (output, partial) is
  private to the request.
- If free pages are short, unlocked leaves are evicted one at a time in the policy's order
  (a parent left childless becomes a candidate), until enough or none: then the request is
  preempted (it takes what there is).
- When it ends, its full output pages join the tree under its last prompt page (opaque keys:
  no lookup matches them), its partial page is freed, and its path is unlocked.
- Orders: lru (last access: the start of the last request that matched or inserted the page),
  fifo (insertion), lfu (requests that used the page, ties lru), priority (the highest priority
  of a request that used it, lowest evicted first, ties lru).

Differences from vLLM's pool: no duplicate pages, output pages are cached, and a parent is never
evicted before its children.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvscope.replay.pool import event_order, harm_arrays
from kvscope.replay.result import SimResult
from kvscope.replay.trace import Trace

RADIX_POLICIES = ("lru", "fifo", "lfu", "priority")


def simulate_radix(
    trace: Trace,
    policy: str,
    capacity_blocks: int,
    priorities: Sequence[float] | None = None,
) -> SimResult:
    """Replay `trace` through an SGLang radix cache of `capacity_blocks` pages."""
    if policy not in RADIX_POLICIES:
        raise ValueError(f"policy {policy!r} has no radix-cache form; known: {RADIX_POLICIES}")
    started = time.perf_counter()
    n, bs = len(trace), trace.block_size
    prio_of = [0.0] * n if priorities is None else [float(p) for p in priorities]
    parent: dict[int, int | None] = {}  # the tree: node key -> parent key (None: root)
    nchild: dict[int, int] = {}
    lock: dict[int, int] = {}
    access: dict[int, int] = {}
    born: dict[int, int] = {}
    uses: dict[int, int] = {}
    prio: dict[int, float] = {}
    owner: dict[int, int] = {}
    stamp: dict[int, int] = {}
    score: Callable[[int], Any] = {
        "lru": lambda k: access[k],
        "fifo": lambda k: born[k],
        "lfu": lambda k: (uses[k], access[k]),
        "priority": lambda k: (prio[k], access[k]),
    }[policy]
    heap: list[tuple[Any, int, int]] = []
    seq = 0
    locked = private = 0
    held: dict[int, tuple[list[int], int, int]] = {}  # request -> (locked path, private, out)
    evicted_by: dict[int, int] = {}
    cached = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=bool)
    harm: dict[tuple[int, int, int], int] = {}
    evictions = 0
    prompt, output = trace.prompt_tokens.tolist(), trace.output_tokens.tolist()
    offsets = trace.offsets.tolist()

    def candidate(k: int) -> None:
        nonlocal seq
        seq += 1
        stamp[k] = seq
        heapq.heappush(heap, (score(k), seq, k))

    def evict_one(i: int) -> bool:
        nonlocal evictions
        while heap:
            _, s, k = heapq.heappop(heap)
            if stamp.get(k) != s or lock[k] or nchild[k]:
                continue
            p = parent.pop(k)
            for d in (nchild, lock, access, born, uses, prio, stamp):
                del d[k]
            o = owner.pop(k)
            if k >= 0:
                evicted_by[k] = (i << 32) | (o + 1)
            evictions += 1
            if p is not None:
                nchild[p] -= 1
                if not nchild[p] and not lock[p]:
                    candidate(p)
            return True
        return False

    def add(k: int, p: int | None, i: int, tick: int, locks: int) -> None:
        parent[k], nchild[k], lock[k] = p, 0, locks
        access[k] = born[k] = tick
        uses[k], prio[k], owner[k] = 1, prio_of[i], i
        if p is not None:
            nchild[p] += 1
        evicted_by.pop(k, None)

    reqs, kinds = event_order(trace)
    tick = 0
    for i, kind in zip(reqs.tolist(), kinds.tolist(), strict=True):
        if kind == 0:  # end: output pages join the tree, the path is unlocked
            path, priv, out = held.pop(i)
            tick += 1
            last = path[-1] if path else None
            for j in range(out):
                k = -((i << 24) + j + 1)
                add(k, last, i, tick, 0)
                last = k
            private -= priv
            if out and last is not None:
                candidate(last)
            for k in path:
                lock[k] -= 1
                if not lock[k]:
                    locked -= 1
                    if not nchild[k]:
                        candidate(k)
            continue

        tick += 1
        keys = trace.keys[offsets[i] : offsets[i + 1]].tolist()
        limit = max(prompt[i] - 1, 0) // bs
        h = 0
        while h < len(keys) and keys[h] in parent:
            h += 1
        in_tree = h
        h = min(h, limit)
        cached[i] = h
        if evicted_by:
            for k in keys[h:]:
                e = evicted_by.get(k)
                if e is not None and k not in parent:
                    row = (i, e >> 32, (e & 0xFFFFFFFF) - 1)
                    harm[row] = harm.get(row, 0) + 1
        path = keys[:in_tree]
        p_i = prio_of[i]
        for k in path:
            if not lock[k]:
                locked += 1
            lock[k] += 1
            access[k] = tick
            uses[k] += 1
            if prio[k] < p_i:
                prio[k] = p_i
        computed = prompt[i] + output[i] - 1
        total, full = -(-computed // bs), computed // bs
        need = total - in_tree
        free = capacity_blocks - len(parent) - private
        while free < need and len(parent) > locked and evict_one(i):
            free += 1
        got = min(need, free)
        if got < need:
            preempted[i] = True
        new = min(got, len(keys) - in_tree)
        last = keys[in_tree - 1] if in_tree else None
        for k in keys[in_tree : in_tree + new]:
            add(k, last, i, tick, 1)
            locked += 1
            last = k
        path = path + keys[in_tree : in_tree + new]
        out = max(0, min(full, in_tree + got) - len(keys)) if in_tree + new == len(keys) else 0
        held[i] = (path, got - new, out)
        private += got - new

    return SimResult(
        policy=policy,
        capacity_blocks=capacity_blocks,
        block_size=bs,
        cached_blocks=cached,
        host_blocks=np.zeros(n, dtype=np.int64),
        preempted=preempted,
        evictions=evictions,
        seconds=time.perf_counter() - started,
        engine="sglang",
        **harm_arrays(harm),
    )
