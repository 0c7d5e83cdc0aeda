"""Reference oracle for kvscope.sim.caches.radix: SGLang's tree written as SGLang writes it, node
objects holding runs of page keys, split where a match ends, evicted whole (slow, plain). Tests
require the flat-slot engine to give the same results on random traces.

The contract it implements is kvscope.sim.caches.radix's module docstring (written once, there).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.sim.caches.events import event_order
from kvscope.sim.caches.pool import harm_arrays
from kvscope.sim.caches.result import SimResult
from kvscope.sim.trace import Trace

RADIX_POLICIES = ("lru", "fifo", "lfu", "priority")


@dataclass(eq=False)
class Node:
    """An SGLang tree node: a run of page keys (output pages: negative, never looked up)."""

    keys: list[int]
    parent: Node | None
    owner: int = -1  # the request that inserted its pages
    lock: int = 0
    access: int = 0
    born: int = 0
    uses: int = 1
    prio: float = 0.0
    children: dict[int, Node] = field(default_factory=dict)  # first key -> child
    alive: bool = True


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
    root = Node([], None)
    where: dict[int, Node] = {}  # page key -> the node holding it
    score: Callable[[Node], Any] = {
        "lru": lambda x: x.access,
        "fifo": lambda x: x.born,
        "lfu": lambda x: (x.uses, x.access),
        "priority": lambda x: (x.prio, x.access),
    }[policy]
    stamp: dict[int, int] = {}  # id(node) -> its live heap entry
    heap: list[tuple[Any, int, Node]] = []
    seq = 0
    pages = locked = private = 0
    held: dict[int, tuple[Node, int, int]] = {}  # request -> (last prompt node, private, out)
    evicted_by: dict[int, int] = {}
    cached = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=bool)
    harm: dict[tuple[int, int, int], int] = {}
    evictions = 0
    prompt, output = trace.prompt_tokens.tolist(), trace.output_tokens.tolist()
    offsets = trace.offsets.tolist()
    prefill_end, start = trace.prefill_ends().tolist(), trace.start_s.tolist()
    times = {0: trace.end_s.tolist(), 1: start}  # an event's time, by kind
    waiting: dict[int, tuple[list[int], int, int]] = {}  # request -> (keys, held, computed)
    pending: list[tuple[float, int, int]] = []  # (prefill end, start rank, request)

    def candidate(x: Node) -> None:
        nonlocal seq
        seq += 1
        stamp[id(x)] = seq
        heapq.heappush(heap, (score(x), seq, x))

    def path_to(x: Node) -> list[Node]:
        out = []
        while x is not root:
            out.append(x)
            x = x.parent  # type: ignore[assignment]
        return out[::-1]

    def split(x: Node, j: int, tick: int) -> Node:
        """SGLang's _split_node: a new node takes x's first j pages; x keeps the rest, touched."""
        front = Node(x.keys[:j], x.parent, x.owner, x.lock, tick, x.born, x.uses, x.prio)
        assert x.parent is not None
        x.parent.children[x.keys[0]] = front
        x.keys, x.parent, x.access = x.keys[j:], front, tick
        front.children[x.keys[0]] = x
        for k in front.keys:
            where[k] = front
        if policy != "fifo" and not x.lock and not x.children:  # its score changed
            candidate(x)
        return front

    def match(keys: list[int], m: int, tick: int) -> Node:
        """Walk m pages of `keys` down the tree, splitting the node they end in; the last node."""
        x, pos = root, 0
        while pos < m:
            child = x.children[keys[pos]]
            if pos + len(child.keys) > m:
                child = split(child, m - pos, tick)
            pos += len(child.keys)
            x = child
        return x

    def add(keys: list[int], under: Node, i: int, tick: int, locks: int) -> Node:
        x = Node(keys, under, i, locks, tick, tick, 1, prio_of[i])
        under.children[keys[0]] = x
        for k in keys:
            where[k] = x
            evicted_by.pop(k, None)
        return x

    def evict_one(i: int) -> int:
        """Evict the first live candidate, whole; its pages (0: none is left)."""
        nonlocal evictions
        while heap:
            _, s, x = heapq.heappop(heap)
            if stamp.get(id(x)) != s or not x.alive or x.lock or x.children:
                continue
            x.alive = False
            del stamp[id(x)]
            parent = x.parent
            assert parent is not None
            del parent.children[x.keys[0]]
            for k in x.keys:
                del where[k]
                if k >= 0:
                    evicted_by[k] = (i << 32) | (x.owner + 1)
            evictions += len(x.keys)
            if parent is not root and not parent.children and not parent.lock:
                candidate(parent)
            return len(x.keys)
        return 0

    def hold(x: Node, i: int, tick: int) -> None:
        nonlocal locked
        if not x.lock:
            locked += len(x.keys)
        x.lock += 1
        x.access = tick
        x.uses += 1
        x.prio = max(x.prio, prio_of[i])

    def settle(i: int, tick: int) -> None:
        """i's prefill ended: SGLang's insert of its prompt (radix.py's module doc)."""
        nonlocal pages, locked, private
        last, priv, out = held[i]
        keys, m, new = waiting.pop(i)
        d = 0
        while d < new and keys[m + d] in where:  # inserted by others meanwhile: not twice
            d += 1
        above = len(path_to(last))
        top = match(keys, m + d, tick)  # the insert's walk ends here: split
        path = path_to(top)
        for x in path[above:]:
            hold(x, i, tick)
        for x in path:
            x.access = tick  # the walk touches the whole path
        if d < new:
            top = add(keys[m + d : m + new], top, i, tick, 1)
            pages += new - d
            locked += new - d
        private -= new
        held[i] = (top, priv, out)

    reqs, kinds = event_order(trace)
    tick = rank = 0
    for i, kind in zip(reqs.tolist(), kinds.tolist(), strict=True):
        while pending and pending[0][0] <= times[kind][i]:
            tick += 1
            settle(heapq.heappop(pending)[2], tick)
        if kind == 0:  # end: output pages join the tree, the path is unlocked
            last, priv, out = held.pop(i)
            tick += 1
            path = path_to(last)
            if out:
                keys = [-((i << 24) + j + 1) for j in range(out)]
                candidate(add(keys, last, i, tick, 0))
                pages += out
            private -= priv
            for x in path:
                x.access = tick  # SGLang's insert at the end touches the whole prompt path
                if out:  # and, inserting past the prompt, raises it to priority + 1
                    x.prio = max(x.prio, prio_of[i] + 1)
                x.lock -= 1
                if not x.lock:
                    locked -= len(x.keys)
                    if not x.children:
                        candidate(x)
            continue

        tick += 1
        keys = trace.keys[offsets[i] : offsets[i + 1]].tolist()
        limit = max(prompt[i] - 1, 0) // bs
        in_tree = 0
        while in_tree < len(keys) and keys[in_tree] in where:
            in_tree += 1
        h = min(in_tree, limit)
        cached[i] = h
        if evicted_by:
            for k in keys[h:]:
                e = evicted_by.get(k)
                if e is not None and k not in where:
                    row = (i, e >> 32, (e & 0xFFFFFFFF) - 1)
                    harm[row] = harm.get(row, 0) + 1
        later = prefill_end[i] > start[i]  # its prompt joins the tree at its prefill end
        m = h if later else in_tree  # what it holds in the tree from now
        last = match(keys, m, tick)  # the match ends here: SGLang splits the node
        for x in path_to(last):
            hold(x, i, tick)
        if h < m:
            match(keys, h, tick)  # SGLang's match stops at the limit: splits there too
        computed = prompt[i] + output[i] - 1
        total, full = -(-computed // bs), computed // bs
        need = total - m
        free = capacity_blocks - pages - private
        while free < need and pages > locked and (freed := evict_one(i)):
            pages -= freed
            free += freed
        got = min(need, free)
        if got < need:
            preempted[i] = True
        new = min(got, len(keys) - m)
        out = max(0, min(full, m + got) - len(keys)) if m + new == len(keys) else 0
        rank += 1
        if later:  # computed now, private until its prefill ends
            waiting[i] = (keys, m, new)
            heapq.heappush(pending, (prefill_end[i], rank, i))
            private += got
        else:
            if new:
                last = add(keys[in_tree : in_tree + new], last, i, tick, 1)
                pages += new
                locked += new
            private += got - new
        held[i] = (last, got - new, out)

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
