"""LRU at many capacities over a trace read a chunk at a time: caches/stack.py's one pass over
stack distances, with memory that follows the largest capacity, not the trace.

    results, columns = stream_sweep(reads, block_size, [1280, 2560, 5120])  # {blocks: SimResult}

`reads` as sim/streamed.py's stream_lru takes them (the readers' chunks, requests in start order
within a window). The pass keeps the window of the largest capacity's most recent keys and a
table of those keys only (stack_kernel.sweep_chunk); per request it adds a few numbers per
capacity. Where the sweep is not exact it raises CannotStream (the caller reads the trace whole,
where caches/stack.py says which capacities to simulate apart and why): requests that overlap in
time, a request without a key for each block it takes, one larger than a capacity, one that
repeats a key, a key a request cannot hit still cached at some capacity, or a request naming an
agent or a workflow (its harm would be reported; this pass attributes none).

Contract: for prompt-only caching (what a stack is defined on), each result equals
`simulate(trace, "lru", c, cache_outputs=False, in_request=...)` on the whole trace in cached
blocks and evictions, with `attributed` False (no harm rows); tests/unit/sim/test_streamed_sweep.py
holds it on random traces cut into chunks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from kvscope.sim.caches import stack_kernel as sk
from kvscope.sim.caches.result import SimResult
from kvscope.sim.caches.stack import NO_KEY, OVERLAP, REPEATED, TOO_BIG, TWO_COPIES
from kvscope.sim.simulate import CACHING, IN_REQUEST
from kvscope.sim.streamed import CannotStream, Part, in_start_order, table_room
from kvscope.sim.trace import prompt_only_lengths

WHY = {sk.REPEATS: REPEATED, sk.BROKEN: TWO_COPIES}


class _Window:
    """sweep_chunk's state between chunks, grown before each chunk to what it may need."""

    def __init__(self, cmax: int, ncaps: int) -> None:
        self.cmax = cmax
        self.st = np.zeros(4, dtype=np.int64)
        self.table = (np.zeros(1 << 10, np.uint64), np.full(1 << 10, -2, np.int64))
        self.buf = np.zeros(1 << 10, dtype=np.int64)
        self.bkey = np.zeros(1 << 10, dtype=np.uint64)
        self.used = np.zeros(ncaps, dtype=np.int64)
        self.evictions = np.zeros(ncaps, dtype=np.int64)

    def reserve(self, keys: int, longest: int) -> None:
        """Room for a chunk of `keys` keys, none of its requests longer than `longest`."""
        a, b = int(self.st[sk.A]), int(self.st[sk.B])
        window = min(self.cmax, b - a + keys)  # the most keys the window holds in the chunk
        if window + longest > len(self.buf):  # (the kernel moves the window to the start)
            size = max(window + longest, 2 * len(self.buf))
            self.buf = _moved(self.buf, a, b, size)
            self.bkey = _moved(self.bkey, a, b, size)
            self.st[sk.A], self.st[sk.B] = 0, b - a
        self.table = table_room(self.table, window + longest)


def _moved(a: np.ndarray, lo: int, hi: int, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=a.dtype)
    out[: hi - lo] = a[lo:hi]
    return out


def stream_sweep(
    reads: Iterable[tuple[Any, np.ndarray, np.ndarray]],
    block_size: int,
    capacities: Sequence[int],
    *,
    in_request: str = IN_REQUEST[0],
) -> tuple[dict[int, SimResult], list[Any]]:
    """({capacity (blocks): its SimResult}, the chunks' Columns as read): see the module doc.
    The results' requests are in start order (ties in file order), as Rows.trace orders them."""
    if in_request not in IN_REQUEST:
        raise ValueError(f"unknown in-request order {in_request!r}; known: {IN_REQUEST}")
    started = time.perf_counter()
    bs, caps = block_size, np.array(sorted({int(c) for c in capacities}), dtype=np.int64)
    if not len(caps) or caps[0] < 1:
        raise ValueError(f"capacities must be one block or more, got {list(capacities)}")
    window = _Window(int(caps[-1]), len(caps))
    columns: list[Any] = []
    cached: list[np.ndarray] = []
    last_end = -np.inf  # the previous request's end (ms): the next must start at it or later

    def parts() -> Iterator[Part]:
        for cols, keys, counts in reads:
            if any(x is not None for x in (*cols.agents, *cols.workflows)):
                raise CannotStream("a request names an agent or a workflow: its harm is reported")
            columns.append(cols)
            yield Part(cols.start_ms, cols.end_ms, cols.prompt, cols.output, keys, counts)

    for part in in_start_order(parts()):
        start, end = np.asarray(part.start, np.float64), np.asarray(part.end, np.float64)
        if len(start) and (start[0] < last_end or (start[1:] < np.maximum(start, end)[:-1]).any()):
            raise CannotStream(OVERLAP)
        last_end = float(max(start[-1], end[-1])) if len(start) else last_end
        prompt = prompt_only_lengths(part.prompt, bs)  # simulate's prompt_only (no output)
        counts = np.asarray(part.counts, np.int64)
        if (np.maximum(-(-(prompt - 1) // bs), 0) != counts).any():
            raise CannotStream(NO_KEY)
        longest = int(counts.max()) if len(counts) else 0
        if longest > caps[0]:
            raise CannotStream(TOO_BIG.format(longest, caps[0]))
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        window.reserve(int(offsets[-1]), longest)
        out = np.zeros((len(counts), len(caps)), dtype=np.int64)
        status = sk.sweep_chunk(
            offsets, np.ascontiguousarray(part.keys, dtype=np.uint64),
            np.maximum(prompt - 1, 0) // bs, caps, in_request == IN_REQUEST[1], window.st,
            *window.table, window.buf, window.bkey, window.used, window.evictions, out,
        )  # fmt: skip
        if status != sk.DONE:
            raise CannotStream(WHY[status])
        cached.append(out)
    every = np.concatenate(cached) if cached else np.zeros((0, len(caps)), dtype=np.int64)
    seconds = (time.perf_counter() - started) / len(caps)
    n, none = len(every), np.zeros(0, dtype=np.int64)
    return {
        int(c): SimResult(
            policy="lru",
            capacity_blocks=int(c),
            block_size=bs,
            cached_blocks=every[:, k].copy(),
            host_blocks=np.zeros(n, dtype=np.int64),
            preempted=np.zeros(n, dtype=bool),
            harm_request=none,
            harm_evictor=none,
            harm_owner=none,
            harm_blocks=none,
            evictions=int(window.evictions[k]),
            seconds=seconds,
            caching=CACHING[1],
            in_request=in_request,
            attributed=False,
        )
        for k, c in enumerate(caps)
    }, columns
