"""SGLang's radix cache: a tree of pages (page size = the trace's block size) grouped into
SGLang's nodes (runs of pages), whole leaf nodes evicted.

Contract, as replayed (SGLang 0.5.23's UnifiedRadixCache):
- A page is cached under its chained block key; its parent is the previous block of the chain
  (the root for the first). Pages form nodes, as in SGLang's compressed tree: a node is a run
  of pages, each the only child of the one before. A node begins where a request inserts pages
  (its prompt pages missing from the tree, its output pages at its end: one node each) and
  where a request's match ends inside a node (at the end of its pages in the tree, and at its
  match limit): SGLang splits the node there. A split leaves the rest of the node touched (its
  last access is now; its insertion is kept).
- A node whose last page has a child is not evictable, nor is one locked by a running request
  (SGLang's lock_ref, held on the whole path of its prompt pages). The pages of a node share
  its lock, uses, priority and last access.
- A request matches its keys in order, at most (prompt - 1) // page_size pages (the last token
  is computed); it needs ceil((prompt + output - 1) / page_size) pages in all, the matched ones
  included, all taken at its start (SGLang's scheduler matches and locks the prefix when it
  forms the prefill batch, get_new_batch_prefill -> init_next_round_input / PrefillAdder, and
  allocates the rest in prepare_for_extend, before the forward pass).
- Its prompt pages enter the tree when its prefill ends (trace.prefill_end_s; SGLang inserts
  them after the forward pass: process_batch_result_prefill -> checkpoint_kv_cache -> insert),
  the whole prompt at once (chunked prefill, which inserts chunk by chunk, is not modelled: a
  prompt is shorter than kvscope's engines' chunk). A request that starts before another's
  prefill end does not match what that one inserts (requests prefilled in one batch share
  nothing they bring); one that starts at or after it does. Until then its computed prompt
  pages are private, and only its matched pages are locked (split where its match ends).
  At its prefill end SGLang's insert walks its prompt: the pages the tree has by then (others
  inserted them meanwhile; the page past its match limit) are locked and touched and its own
  copies freed (the insert returns the matched length, the scheduler frees the duplicate KV);
  the rest become one node under them, locked, inserted then (last access, insertion, owner);
  the node where the walk ends is split there; the whole path is touched.
- A prefill end at or before the start (every trace without prefill timing) inserts at the
  start, as a request alone in its batch: prompt pages the tree already has past the match
  limit are then locked, not taken (SGLang would take them and free them right after).
  Events are in start order (ends first at equal times, events.event_order); before an event,
  the insertions of prefill ends at or before its time are applied, in prefill-end order
  (ties: start order). The rest (output, partial) is private to the request.
- If free pages are short, unlocked leaf nodes are evicted in the policy's order, each whole
  (all its pages, as SGLang's evict frees a node's whole value; a parent left childless
  becomes a candidate), until enough are free or none is evictable: then the request is
  preempted (it takes what there is). Free pages beyond the need stay free.
- When it ends, its full output pages join the tree as one node under its last prompt page
  (opaque keys: no lookup matches them), its partial page is freed, and its path is touched
  (SGLang inserts prompt + output, walking the prompt path) and unlocked.
- Orders: lru (last access: the start, prefill end or end of the last request whose prompt
  path holds the page, or whose match or insert split its node), fifo (insertion; a split
  node's parts keep it), lfu (requests that used the page, ties lru), priority (the highest
  priority of a request that used it, lowest evicted first, ties lru; when a request's output
  joins the tree, its prompt path gets at least its priority + 1, as SGLang re-inserts the
  prompt so that eviction drops the output first).

Differences from vLLM's pool: no duplicate pages, output pages are cached, a parent is never
evicted before its children, and eviction frees whole nodes (it may free more than it needs).

Layout: the tree lives in flat slots [0, capacity), one per cached page, each field a parallel
Python list indexed by slot (parent slot, children count, lock count, last access, ...), and a
dict from prompt key to slot; a freed slot goes back on a free list. Node boundaries are two
more fields: `head[slot]` (the page begins its node) and `nxt[slot]` (the next page of its node,
-1 at the node's last page). A node's policy state is read at its last page; a split touches
the rest's last page. Candidates for eviction are one heap of packed ints (score, push
sequence, slot) over nodes' last pages: an entry is live while `stamp[slot]` equals it and the
slot is an unlocked leaf; evicting it frees pages up the parent chain to the node's head. Per
request, the matched path is locked, touched and unlocked with C-level map calls and
comprehensions; a Python statement runs per evicted page and per page of a split node's rest
only. Keys are assumed distinct within a request's chain (chained hashes). Results equal the
node-tree implementation kept as tests/unit/sim/radix_reference.py.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from kvscope.sim.caches.events import event_order
from kvscope.sim.caches.pool import harm_arrays
from kvscope.sim.caches.result import SimResult
from kvscope.sim.trace import Trace

RADIX_POLICIES = ("lru", "fifo", "lfu", "priority")
_ADD1, _SUB1 = (1).__add__, (-1).__add__


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
    n, bs, cap = len(trace), trace.block_size, max(capacity_blocks, 0)
    if priorities is not None and len(priorities) != n:
        raise ValueError(f"{len(priorities)} priorities for {n} requests")
    # by rank among the distinct values of p and p + 1 (what a prompt path gets at the end):
    # same order, packable ints
    p_val = np.zeros(n) if priorities is None else np.asarray(priorities, float)
    ranks = np.unique(np.concatenate([p_val, p_val + 1]), return_inverse=True)[1].tolist()
    prio_of, prio_end = ranks[:n], ranks[n:]
    prompt, output = trace.prompt_tokens.tolist(), trace.output_tokens.tolist()
    offsets = trace.offsets.tolist()
    start_l, end_l = trace.start_s.tolist(), trace.end_s.tolist()
    pe_l = None if trace.prefill_end_s is None else trace.prefill_ends().tolist()
    # packed heap entries: (score, seq, slot); score = (major, tick) with major the uses (lfu),
    # the priority rank (priority) or 0, tick the last access (lru, lfu, priority) or the
    # insertion (fifo). Widths are bounds, not guesses: Python ints never overflow anyway.
    pages = -(-(trace.prompt_tokens + trace.output_tokens - 1) // bs)
    b_slot = max(cap - 1, 1).bit_length()
    b_seq = (2 * int(pages.sum()) + 4 * n + 2).bit_length()  # pushes: ends, splits, evictions
    b_tick = (3 * n + 2).bit_length()  # starts, prefill ends, ends
    sh_seq, sh_score = b_slot, b_slot + b_seq
    mask = (1 << b_slot) - 1

    parent = [-1] * cap  # slot of the parent page; -1: the root
    nchild = [0] * cap
    lock = [0] * cap
    access = [0] * cap
    born = [0] * cap
    uses = [0] * cap
    prio = [0] * cap
    owner = [0] * cap
    keyof = [-1] * cap  # the page's prompt key; -1: an output page (opaque)
    stamp = [-1] * cap  # the slot's live heap entry; -1: none
    head = [False] * cap  # the page begins its SGLang node
    nxt = [-1] * cap  # the next page of its node; -1: the node's last page
    free_slots = list(range(cap - 1, -1, -1))
    index: dict[int, int] = {}  # prompt key -> slot
    index_get = index.get
    heap: list[int] = []
    push, pop = heapq.heappush, heapq.heappop
    seq = 0
    nodes = locked = private = 0
    held: dict[int, tuple[list[int], int, int]] = {}  # request -> (locked path, private, out)
    waiting: dict[int, list[int]] = {}  # request -> its computed prompt keys, not in the tree yet
    pending: list[tuple[float, int, int]] = []  # heap: (prefill end, start rank, request)
    evicted_by: dict[int, int] = {}
    cached = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=bool)
    harm: dict[tuple[int, int, int], int] = {}
    evictions = 0
    lru, fifo, lfu = policy == "lru", policy == "fifo", policy == "lfu"

    def entry(s: int) -> int:
        nonlocal seq
        seq += 1
        if lru:
            score = access[s]
        elif fifo:
            score = born[s]
        else:
            score = ((uses[s] if lfu else prio[s]) << b_tick) | access[s]
        e = (score << sh_score) | (seq << sh_seq) | s
        stamp[s] = e
        return e

    tick_fields = [born] if fifo else [access]  # the fields a policy's score reads

    def chain(ins: list[int], last: int, i: int, tick: int, locks: int) -> None:
        """Slots `ins` become a chain of new pages under `last` (-1: the root), used by i."""
        m = len(ins)
        if last >= 0:
            nchild[last] += 1
        deque(map(parent.__setitem__, ins, [last, *ins[:-1]]), maxlen=0)
        deque(map(nchild.__setitem__, ins, repeat(1, m - 1)), maxlen=0)
        nchild[ins[-1]] = 0
        deque(map(nxt.__setitem__, ins, [*ins[1:], -1]), maxlen=0)
        deque(map(head.__setitem__, ins, repeat(False, m)), maxlen=0)
        head[ins[0]] = True
        deque(map(lock.__setitem__, ins, repeat(locks, m)), maxlen=0)
        deque(map(owner.__setitem__, ins, repeat(i, m)), maxlen=0)
        for field in tick_fields:
            deque(map(field.__setitem__, ins, repeat(tick, m)), maxlen=0)
        if lfu:
            deque(map(uses.__setitem__, ins, repeat(1, m)), maxlen=0)
        elif not lru and not fifo:
            deque(map(prio.__setitem__, ins, repeat(prio_of[i], m)), maxlen=0)

    def split(p: int, tick: int) -> None:
        """End p's node at p, as SGLang splits a node where a match ends; the rest is touched."""
        c = nxt[p]
        if c < 0:
            return
        nxt[p] = -1
        head[c] = True
        if fifo:  # the rest keeps its insertion; the front part inherits it too
            return
        t = c
        while nxt[t] >= 0:
            t = nxt[t]
        access[t] = tick
        if not lock[t] and not nchild[t]:
            push(heap, entry(t))

    def take(m: int) -> list[int]:
        ins = free_slots[len(free_slots) - m :][::-1]
        del free_slots[len(free_slots) - m :]
        return ins

    def insert(i: int, ks: list[int], path: list[int], tick: int) -> list[int]:
        """Keys `ks` become a new locked node of i under `path`; the path to its end."""
        nonlocal nodes, locked
        ins = take(len(ks))
        index.update(zip(ks, ins, strict=True))
        if evicted_by:
            deque(map(evicted_by.pop, ks, repeat(None)), maxlen=0)
        chain(ins, path[-1] if path else -1, i, tick, 1)
        deque(map(keyof.__setitem__, ins, ks), maxlen=0)
        nodes += len(ks)
        locked += len(ks)
        return path + ins

    def hold(path: list[int], i: int, tick: int) -> None:
        """i locks and touches `path` (pages in the tree), as it uses them."""
        nonlocal locked
        lk = list(map(lock.__getitem__, path))
        locked += lk.count(0)
        deque(map(lock.__setitem__, path, map(_ADD1, lk)), maxlen=0)
        deque(map(access.__setitem__, path, repeat(tick)), maxlen=0)
        if lfu:
            deque(map(uses.__setitem__, path, map(_ADD1, map(uses.__getitem__, path))), 0)
        elif not lru and not fifo:
            p_i = prio_of[i]
            deque(map(prio.__setitem__, path, [max(prio[s], p_i) for s in path]), 0)

    def settle(i: int, tick: int) -> None:
        """i's prefill ended: its prompt joins the tree (SGLang's insert; module doc)."""
        nonlocal private
        path, priv, out = held[i]
        ks = waiting.pop(i)
        slots = list(map(index_get, ks))
        d = slots.index(None) if None in slots else len(slots)
        if d:  # in the tree by now: locked, its own copies freed
            dup: list[int] = slots[:d]  # type: ignore[assignment]
            hold(dup, i, tick)
            path = path + dup
        if path:  # the insert walks (touches) the whole path and splits where it ends
            deque(map(access.__setitem__, path, repeat(tick)), maxlen=0)
            split(path[-1], tick)
        if d < len(ks):
            path = insert(i, ks[d:], path, tick)
        private -= len(ks)
        held[i] = (path, priv, out)

    reqs, kinds = event_order(trace)
    tick = rank = 0
    for i, kind in zip(reqs.tolist(), kinds.tolist(), strict=True):
        if pending:  # prefill ends at or before this event: their prompts join the tree
            t = start_l[i] if kind else end_l[i]
            while pending and pending[0][0] <= t:
                tick += 1
                settle(heapq.heappop(pending)[2], tick)
        if kind == 0:  # end: output pages join the tree, the path is unlocked
            path, priv, out = held.pop(i)
            tick += 1
            last = path[-1] if path else -1
            if out:
                ins = take(out)
                chain(ins, last, i, tick, 0)
                deque(map(keyof.__setitem__, ins, repeat(-1, out)), maxlen=0)
                last = ins[-1]
                nodes += out
                push(heap, entry(last))
            private -= priv
            if path:
                if not fifo:  # SGLang's insert at the end touches the whole prompt path
                    deque(map(access.__setitem__, path, repeat(tick)), maxlen=0)
                if out and not lru and not fifo and not lfu:  # and, past it, to priority + 1
                    p_e = prio_end[i]
                    deque(map(prio.__setitem__, path, [max(prio[s], p_e) for s in path]), 0)
                lk = list(map(_SUB1, map(lock.__getitem__, path)))
                deque(map(lock.__setitem__, path, lk), maxlen=0)
                if 0 in lk:  # unlocked now: the leaves among them are candidates, in path order
                    zero = [s for s, v in zip(path, lk, strict=True) if not v]
                    locked -= len(zero)
                    for s in [s for s in zero if not nchild[s]]:
                        push(heap, entry(s))
            continue

        tick += 1
        keys = trace.keys[offsets[i] : offsets[i + 1]].tolist()
        limit = max(prompt[i] - 1, 0) // bs
        slots = list(map(index_get, keys))
        in_tree = slots.index(None) if None in slots else len(slots)
        h = min(in_tree, limit)
        cached[i] = h
        if evicted_by and not evicted_by.keys().isdisjoint(keys[h:]):
            for k in keys[h:]:
                e = evicted_by.get(k)
                if e is not None and k not in index:
                    row = (i, e >> 32, (e & 0xFFFFFFFF) - 1)
                    harm[row] = harm.get(row, 0) + 1
        later = pe_l is not None and pe_l[i] > start_l[i]  # its prompt joins the tree then
        m = h if later else in_tree  # the tree's pages it holds from now
        path: list[int] = slots[:m]  # type: ignore[assignment]
        if path:
            hold(path, i, tick)
            split(path[-1], tick)  # the match ends here: a node boundary
            if h < m and h:
                split(path[h - 1], tick)  # SGLang's match stops at the limit: another one
        computed = prompt[i] + output[i] - 1
        total, full = -(-computed // bs), computed // bs
        need = total - m
        free = cap - nodes - private
        while free < need and nodes > locked:  # evict unlocked leaf nodes, each whole
            while heap:
                e = pop(heap)
                s = e & mask
                if stamp[s] == e and not lock[s] and not nchild[s]:
                    break
            else:
                break
            while True:  # the node's pages, from its last up to its head
                stamp[s] = -1
                k = keyof[s]
                if k >= 0:
                    del index[k]
                    evicted_by[k] = (i << 32) | (owner[s] + 1)
                free_slots.append(s)
                nodes -= 1
                evictions += 1
                free += 1
                p = parent[s]
                if head[s]:
                    break
                s = p
            if p >= 0:
                nchild[p] -= 1
                if not nchild[p] and not lock[p]:
                    push(heap, entry(p))
        got = min(need, free)
        if got < need:
            preempted[i] = True
        new = min(got, len(keys) - m)
        out = max(0, min(full, m + got) - len(keys)) if m + new == len(keys) else 0
        rank += 1
        if later:  # computed now, private until its prefill ends
            waiting[i] = keys[m : m + new]
            heapq.heappush(pending, (pe_l[i], rank, i))  # type: ignore[index]
            private += got
        else:
            if new:
                path = insert(i, keys[m : m + new], path, tick)
            private += got - new
        held[i] = (path, got - new, out)

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
