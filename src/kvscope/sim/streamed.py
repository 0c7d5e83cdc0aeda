"""LRU on vLLM's block pool over a trace read a chunk at a time: memory follows the cache, not
the trace.

    result, rows = stream_lru(reads, block_size, capacity_blocks, cache_outputs=False)

`reads` yields a trace's requests in file order, a chunk at a time, as the readers make them
(sim/inputs: `Columns`, the chunk's block keys flat, the keys per request). Requests must come in
start order (a start before the previous one raises `NotInOrder`: the caller reads the trace
whole instead, which sorts it). Each chunk's events (its starts, and the ends of earlier requests
that come before its last start) are put in replay order as caches/events.py's `event_order`
orders a whole trace (by time, ends before starts, then index; a request without duration ends
right after its own start), ends still to come carried to the next chunk, and replayed by
stream_kernel.run_chunk, which keeps the pool's state between chunks.

Contract: the same SimResult as `simulate(trace, "lru", capacity_blocks, cache_outputs=...,
in_request=...)` on the whole trace (cached blocks, preemptions, evictions, harm rows), which
tests/unit/sim/test_streamed.py holds on random traces cut into chunks. The keys are never all
in memory: the pool's state is as large as the blocks it used (at most the capacity), a table of
the keys it holds and one of the keys it evicted (for the harm rows); per request, a few numbers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from kvscope.sim.caches import stream_kernel as k
from kvscope.sim.caches.pool_compiled import harm_rows
from kvscope.sim.caches.result import SimResult
from kvscope.sim.simulate import CACHING, IN_REQUEST
from kvscope.sim.trace import prompt_only_lengths

WINDOW_PARTS = 2  # how many chunks late (in file order) a request may come and still be sorted


class CannotStream(Exception):
    """The trace cannot be replayed as it is read (the message says why): read it whole."""


class NotInOrder(CannotStream):
    """A request starts before one already replayed: the trace is not in start order."""

    def __init__(self) -> None:
        super().__init__(
            "a request starts before one already replayed (the file is out of start order by "
            f"more than the {WINDOW_PARTS} chunks of lines sorted as they are read)"
        )


class _Pool:
    """The kernel's state between chunks, grown before each chunk to what it may need."""

    BLOCK_TYPES = (np.int32, np.int32, np.int8, np.uint64, np.int64, np.int32, np.int32,
                   np.int64, np.int32, np.int32, np.bool_)  # fmt: skip
    BLOCK_FILL = (0, 0, 0, 0, -1, -1, -1, 0, -1, -1, False)  # blank .. inq (run_chunk's order)

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.sc = np.zeros(k.SCALARS, dtype=np.int64)
        self.sc[[k.HEAD, k.TAIL]] = -1
        self.blocks = tuple(
            np.full(0, f, dtype=t) for t, f in zip(self.BLOCK_TYPES, self.BLOCK_FILL, strict=True)
        )
        self.first = (np.zeros(1 << 10, np.uint64), np.full(1 << 10, -2, np.int64))
        self.evicted = (np.zeros(1 << 10, np.uint64), np.full(1 << 10, -2, np.int64))
        self.arena = np.empty(1 << 16, dtype=np.int32)
        self.running = tuple(np.zeros(0, dtype=np.int64) for _ in range(4))

    def reserve(self, requests: int, demand: int, attribute: bool) -> None:
        """Room for `requests` requests in all and `demand` more blocks taken."""
        used = min(self.cap, int(self.sc[k.FRESH]) + demand)
        if used > len(self.blocks[0]):
            size = min(self.cap, max(used, 2 * len(self.blocks[0])))
            fills = zip(self.blocks, self.BLOCK_FILL, strict=True)
            self.blocks = tuple(_grown(a, size, f) for a, f in fills)
        self.first = table_room(self.first, int(self.sc[k.NFIRST]) + min(demand, self.cap))
        if attribute:
            self.evicted = table_room(self.evicted, int(self.sc[k.NEVICTED]) + demand)
        if requests > len(self.running[0]):
            size = max(requests, 2 * len(self.running[0]))
            self.running = tuple(_grown(a, size, 0) for a in self.running)


def _grown(a: np.ndarray, size: int, fill: Any) -> np.ndarray:
    out = np.full(size, fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


def table_room(table: tuple[np.ndarray, np.ndarray], entries: int) -> tuple[np.ndarray, np.ndarray]:
    """`table` with at most half of its slots taken by `entries`."""
    size = len(table[0])
    while 2 * entries > size:
        size *= 2
    return table if size == len(table[0]) else k.grow_table(*table, size)


def stream_lru(
    reads: Iterable[tuple[Any, np.ndarray, np.ndarray]],
    block_size: int,
    capacity_blocks: int,
    *,
    cache_outputs: bool = True,
    in_request: str = IN_REQUEST[0],
    attribute: bool = True,
    window: int = WINDOW_PARTS,
) -> tuple[SimResult, list[Any]]:
    """(the replay's SimResult, the chunks' Columns as read): see the module doc. The result's
    requests are in start order (ties in file order), as Rows.trace orders the Columns;
    `window`: how many chunks late a request may come (`in_start_order`).
    `attribute` False: no harm rows, and no table of evicted keys (memory then follows the cache
    alone); a request that names an agent or a workflow, whose harm would be reported, raises
    CannotStream."""
    if in_request not in IN_REQUEST:
        raise ValueError(f"unknown in-request order {in_request!r}; known: {IN_REQUEST}")
    started = time.perf_counter()
    bs, pool = block_size, _Pool(max(capacity_blocks, 1))
    columns: list[Any] = []  # as read: the caller's Rows.trace sorts them as they were replayed
    cached, preempted, harm = [], [], []
    carried = (np.zeros(0, np.int64), np.zeros(0, np.float64))  # ends still to come

    def parts() -> Iterator[Part]:
        for cols, keys, counts in reads:
            if not attribute and any(x is not None for x in (*cols.agents, *cols.workflows)):
                raise CannotStream("a request names an agent or a workflow: its harm is reported")
            columns.append(cols)
            yield Part(cols.start_ms, cols.end_ms, cols.prompt, cols.output, keys, counts)

    base, last_start = 0, -np.inf
    chunks = in_start_order(parts(), window)
    chunk = next(chunks, None)
    while chunk is not None:
        part, chunk = chunk, next(chunks, None)
        keys, counts = part.keys, part.counts
        start, end = part.start / 1e3, part.end / 1e3  # Rows.trace's seconds
        m = len(start)
        if m and (start[0] < last_start or (np.diff(start) < 0).any()):
            raise NotInOrder
        last_start = start[-1] if m else last_start
        prompt, output = np.asarray(part.prompt, np.int64), np.asarray(part.output, np.int64)
        if not cache_outputs:  # simulate's prompt_only: whole blocks and one token, no output
            prompt, output = prompt_only_lengths(prompt, bs), output * 0
        offsets = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        reqs, kinds, carried = _events(base, start, end, carried, chunk is None)
        demand = int(np.maximum(-(-(prompt + output - 1) // bs), 0).sum())
        pool.reserve(base + m, demand, attribute)
        out_cached, out_pre = np.zeros(m, np.int64), np.zeros(m, np.bool_)
        rows = np.empty((len(keys) + 1 if attribute else 1, 3), dtype=np.int64)  # harm rows
        pool.arena, nharm = k.run_chunk(
            reqs, kinds, base, prompt, output, offsets,
            np.ascontiguousarray(keys, dtype=np.uint64), bs, pool.cap,
            in_request == IN_REQUEST[1], attribute, pool.sc, pool.blocks, *pool.first,
            *pool.evicted, pool.arena, pool.running, out_cached, out_pre, rows,
        )  # fmt: skip
        cached.append(out_cached)
        preempted.append(out_pre)
        harm.append(rows[:nharm].copy())
        base += m
    result = SimResult(
        policy="lru",
        capacity_blocks=capacity_blocks,
        block_size=bs,
        cached_blocks=_joined(cached, np.int64),
        host_blocks=np.zeros(base, dtype=np.int64),
        preempted=_joined(preempted, np.bool_),
        evictions=int(pool.sc[k.EVICTIONS]),
        seconds=time.perf_counter() - started,
        caching=CACHING[0] if cache_outputs else CACHING[1],
        in_request=in_request,
        attributed=attribute,
        **harm_rows(np.concatenate(harm) if harm else np.zeros((0, 3), np.int64)),
    )
    return result, columns


class Part(NamedTuple):
    """Requests as the replay needs them: start and end (ms), prompt and output tokens, their
    block keys flat and how many each has."""

    start: np.ndarray
    end: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    keys: np.ndarray
    counts: np.ndarray

    def __len__(self) -> int:  # type: ignore[override]
        return len(self.counts)

    def taken(self, idx: np.ndarray) -> Part:
        """The requests at `idx`, in that order."""
        if len(idx) and idx[-1] - idx[0] == len(idx) - 1 and (np.diff(idx) == 1).all():
            lo, hi = int(idx[0]), int(idx[-1]) + 1  # a run of requests: slices, no copy
            first = int(self.counts[:lo].sum())
            keys = self.keys[first : first + int(self.counts[lo:hi].sum())]
            return Part(*(a[lo:hi] for a in self[:4]), keys, self.counts[lo:hi])
        starts = np.cumsum(self.counts) - self.counts
        picked = self.counts[idx]
        at = np.repeat(starts[idx] - (np.cumsum(picked) - picked), picked)
        keys = self.keys[at + np.arange(len(at))]
        return Part(*(a[idx] for a in self[:4]), keys, picked)


def in_start_order(parts: Iterable[Part], window: int = WINDOW_PARTS) -> Iterator[Part]:
    """The parts' requests in start order (ties in file order, as Rows.trace sorts them), a
    part at a time, for a file whose requests are out of order only within a window: each part
    read releases the requests held or read that start before the earliest start of the last
    `window` parts read; the rest wait. A request that starts before one already released (it
    came more than about `window` parts late) raises NotInOrder."""
    held: Part | None = None
    released = -np.inf
    edges: deque[float] = deque(maxlen=window)
    for part in parts:
        if not len(part):
            continue
        edges.append(float(part.start.min()))
        if edges[-1] < released:
            raise NotInOrder
        edge = min(edges)
        if held is not None:  # file order: the held requests were read first
            part = Part(*(np.concatenate([a, b]) for a, b in zip(held, part, strict=True)))
        order = np.argsort(part.start, kind="stable")
        cut = int(np.searchsorted(part.start[order], edge, side="left"))
        if cut:
            released = float(part.start[order[cut - 1]])
            yield part.taken(order[:cut])
        held = part.taken(np.sort(order[cut:]))
    if held is not None:
        yield held.taken(np.argsort(held.start, kind="stable"))


def _joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _events(
    base: int,
    start: np.ndarray,
    end: np.ndarray,
    carried: tuple[np.ndarray, np.ndarray],
    last: bool,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """(requests, kinds: 1 start / 0 end) of a chunk's events in replay order, and the ends
    carried on: those after the chunk's last start (none after the last chunk: nothing starts
    after them). An end at the last start is replayed now: it comes before any start at its
    time, the next chunk's included."""
    m = len(start)
    idx = np.arange(base, base + m, dtype=np.int64)
    zero = end <= start  # ends right after its own start, whenever that is
    cut = np.inf if last or not m else start[-1]
    end_idx = np.concatenate([carried[0], idx[~zero]])
    end_at = np.concatenate([carried[1], end[~zero]])
    now = end_at <= cut
    ev_idx = np.concatenate([end_idx[now], idx[zero], idx])
    ev_time = np.concatenate([end_at[now], start[zero], start])
    n_end, n_zero = int(now.sum()), int(zero.sum())
    is_start = np.concatenate([np.zeros(n_end + n_zero, np.int8), np.ones(m, np.int8)])
    tier = np.concatenate([np.zeros(n_end, np.int8), np.ones(n_zero + m, np.int8)])
    perm = np.lexsort((1 - is_start, ev_idx, tier, ev_time))
    return ev_idx[perm], is_start[perm], (end_idx[~now], end_at[~now])
