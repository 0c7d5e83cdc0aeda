"""LRU at many capacities in one pass: Mattson's stack distances over vLLM's block pool.

    results, why = lru_sweep(trace, [1280, 2560, 5120])   # {capacity_blocks: SimResult}, reason

An LRU cache of C blocks holds the C most recently used keys, whatever C is (the inclusion
property): one pass that knows, for each request, how deep each of its keys lies in the LRU
stack gives the hits of every capacity at once. vLLM's block pool (pool.py) is such a stack over
keys exactly when every block it holds carries one distinct prompt key and nothing else decides
which block goes, i.e. where all of the following hold, checked here:

- prompt-only caching (`trace` is `prompt_only`'s: a request takes exactly its full prompt
  blocks, each keyed), no host tier (simulate.sweep_lru decides those); tail-first or
  head-first in-request order;
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

Cost: one compiled loop over requests (stack_kernel.py), over the keys' dense ids (key_ids.py,
shared with the pool's cells of the same trace): per key a binary search in the window of the
`max(capacities)` most recent keys (deeper keys miss at every capacity asked), per request and
capacity a few integer steps, per harmed key and capacity a short galloping search for its
evictor. 100k requests, 9.5 M key positions: ~0.3 s at one capacity, ~0.9 s at ten, where
the compiled pool takes ~0.45 s per capacity. Memory while it runs: 5 bytes a key position
(the owners' chain), 8 a distinct key, 12 a request and capacity, 24 a harm row; the owners
do not grow with the number of capacities.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from kvscope.sim.caches.events import event_order
from kvscope.sim.caches.key_ids import key_ids
from kvscope.sim.caches.pool_compiled import harm_rows
from kvscope.sim.caches.result import SimResult
from kvscope.sim.trace import Trace

OVERLAP = "requests overlap in time (running requests pin blocks)"
NO_KEY = "a request takes blocks without a prompt key"
REPEATED = "a request repeats a key in its prompt"
TWO_COPIES = "a key a request cannot hit was still cached (two copies in the pool)"
TOO_BIG = "a request needs {} blocks, more than {} (it would be preempted)"
TOO_MANY = "2**31 key positions or more (the pass counts them in int32)"
MAX_CAPACITIES = 127  # per pass (stack_kernel counts a key's capacities in int8); more: passes


def sequential_order(trace: Trace) -> np.ndarray | None:
    """The requests in replay order when none overlaps another (each ends before the next
    starts, in events.event_order's order); None when two overlap."""
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
    ({capacity: SimResult}, {capacity: why it is simulated apart instead}). `trace` must be the
    prompt-only trace the pool would replay; `head_first`: a request's first block is the least
    recent of its blocks (pool.py's head_first), not its last. Each result's `seconds` is its
    share of the pass."""
    started = time.perf_counter()
    caps = sorted(set(int(c) for c in capacities))
    order = sequential_order(trace)
    if order is None:
        return {}, dict.fromkeys(caps, OVERLAP)
    if not whole_blocks(trace):
        return {}, dict.fromkeys(caps, NO_KEY)
    counts = np.diff(trace.offsets)
    biggest = int(counts.max()) if len(counts) else 0
    why = {c: TOO_BIG.format(biggest, c) for c in caps if c < max(biggest, 1)}
    exact = [c for c in caps if c not in why]
    if exact and len(trace.keys) >= 2**31 - 1:
        return {}, {**why, **dict.fromkeys(exact, TOO_MANY)}
    results: dict[int, SimResult] = {}
    for at in range(0, len(exact), MAX_CAPACITIES):
        found, refused = _pass(trace, order, exact[at : at + MAX_CAPACITIES], head_first)
        if isinstance(refused, str):  # REPEATED: no capacity is a stack
            return {}, dict.fromkeys(caps, refused)
        results.update(found)
        why.update(refused)
    seconds = (time.perf_counter() - started) / max(len(results), 1)
    return {c: replace(r, seconds=seconds) for c, r in results.items()}, why


def _pass(
    trace: Trace, order: np.ndarray, caps: list[int], head_first: bool
) -> tuple[dict[int, SimResult], dict[int, str] | str]:
    """stack_kernel.sweep at `caps` (fewer than 128): ({capacity: SimResult}, {capacity: why
    not}), or REPEATED for all. A capacity above every key the trace takes behaves as that many
    (nothing is ever evicted): the window is no larger than its keys."""
    from kvscope.sim.caches.stack_kernel import ALL_BROKEN, REPEATS, sweep

    kids, nids = key_ids(trace.keys)
    bs = trace.block_size
    limits = np.maximum(np.asarray(trace.prompt_tokens, dtype=np.int64) - 1, 0) // bs
    status, cached, evictions, broken, harm, ends = sweep(
        order.astype(np.int64),
        np.ascontiguousarray(trace.offsets, dtype=np.int64),
        kids,
        np.int64(nids),
        limits,
        np.minimum(np.array(caps, dtype=np.int64), max(len(kids), 1)),
        head_first,
    )
    if status == REPEATS:
        return {}, REPEATED
    if status == ALL_BROKEN:
        return {}, dict.fromkeys(caps, TWO_COPIES)
    increasing = bool((np.diff(order) > 0).all())
    n = len(trace)
    results, why = {}, {}
    for k, c in enumerate(caps):
        if broken[k]:
            why[c] = TWO_COPIES
            continue
        results[c] = SimResult(
            policy="lru",
            capacity_blocks=c,
            block_size=bs,
            cached_blocks=cached[:, k].copy(),
            host_blocks=np.zeros(n, dtype=np.int64),
            preempted=np.zeros(n, dtype=bool),
            evictions=int(evictions[k]),
            seconds=0.0,
            **harm_rows(harm[ends[k] : ends[k + 1]], presorted=increasing),
        )
    return results, why
