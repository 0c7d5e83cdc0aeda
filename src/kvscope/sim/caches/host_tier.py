"""A host tier under the device pool, and KVFlow-style prefetch; per-agent splits of a result.

Contract (vLLM semantics only; pool.py calls it):
- The host tier holds up to `capacity` keys, LRU. A key whose last device copy is evicted is
  written to the host (offload); a host lookup or a new offload makes a key most recent there.
- A request first hits on the device (its cached blocks); from the first device miss on, the
  keys found consecutively in the host are host hits, loaded back into newly taken device
  blocks (a load instead of a recompute); the rest are misses. The match limit is the device's.
- Prefetch (KVFlow): the host hits of a request whose agent has already been seen to follow
  its previous agent (the step graph, learned online from the transitions before it) were
  fetched into the device tier before the call: they are counted in `prefetched` (a subset
  of the host hits, whose load is off the critical path). The device contents do not change.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvscope.sim.caches.result import SimResult
from kvscope.sim.trace import Trace


class HostTier:
    """LRU key store below the device; see the module docstring."""

    def __init__(self, capacity: int, *, prefetch: bool = False) -> None:
        if capacity < 0:
            raise ValueError("host capacity must be >= 0")
        self.capacity = capacity
        self.prefetch = prefetch
        self._keys: OrderedDict[int, None] = OrderedDict()
        self._seen: set[tuple[str, str]] = set()
        self._trace: Trace | None = None

    def bind(self, trace: Trace) -> None:
        self._trace = trace
        self.hits = np.zeros(len(trace), dtype=np.int64)
        self.prefetched = np.zeros(len(trace), dtype=np.int64)

    def offload(self, keys: list[int]) -> None:
        """Keys whose last device copy was just evicted."""
        store = self._keys
        for k in keys:
            store[k] = None
            store.move_to_end(k)
        while len(store) > self.capacity:
            store.popitem(last=False)

    def match(self, i: int, keys: list[int], h: int, limit: int) -> int:
        """Host hits of request i from block h on (its device hits stop there)."""
        store, hh = self._keys, 0
        for k in keys[h:limit]:
            if k not in store:
                break
            store.move_to_end(k)
            hh += 1
        self.hits[i] = hh
        assert self._trace is not None
        prev, agent = self._trace.previous_agents[i], self._trace.agents[i]
        if prev is not None and agent is not None:
            if self.prefetch and (prev, agent) in self._seen:
                self.prefetched[i] = hh
            self._seen.add((prev, agent))
        return hh


def split_by_agent(trace: Trace, result: SimResult) -> dict[str | None, dict[str, int]]:
    """Per agent: prompt blocks hit on the device, loaded from the host (and of those,
    prefetched), and missed (recomputed)."""
    total = np.diff(trace.offsets)
    out: dict[str | None, dict[str, int]] = {}
    for i, a in enumerate(trace.agents):
        row = out.setdefault(a, {"device": 0, "host": 0, "prefetched": 0, "missed": 0})
        d, h = int(result.cached_blocks[i]), int(result.host_blocks[i])
        row["device"] += d
        row["host"] += h
        if result.prefetched_blocks is not None:
            row["prefetched"] += int(result.prefetched_blocks[i])
        row["missed"] += int(total[i]) - d - h
    return out
