"""The replay's clock: a trace's requests as start and end events in replay order, and each
request's place among the starts. Every cache (pool.py, pool_compiled.py, radix.py) replays
these events."""

from __future__ import annotations

import numpy as np

from kvscope.sim.trace import Trace


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
