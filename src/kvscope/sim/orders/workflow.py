"""Workflow-aware eviction orders: KVFlow's steps-to-execution and a PBKV-style predictor.

Both tag each block with the agents whose requests used it since it got its key (a bit mask)
and keep evictable blocks grouped by mask, LRU within a group. At each eviction the group to
evict from is the one with the smallest `group_key(mask)`; equal keys fall back to LRU (the
group whose head was released first). Keys depend on the workflows in flight, so they are
recomputed lazily after each request start or workflow end, per mask (few), not per block.

A workflow is in flight from its first request's start to its last request's end (taken from
the trace: the replay knows where each workflow ends); its position is the agent of its latest
started request. Requests without an agent tag nothing; a block no agent used has key "never".
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict, deque
from itertools import islice

import numpy as np

from kvscope.sim.orders.base import EvictionOrder
from kvscope.sim.trace import Trace

FAR = 1 << 30  # steps to an agent no workflow in flight can reach


class AgentGroupOrder(EvictionOrder):
    """Groups of evictable blocks by agent mask; subclasses define `group_key`."""

    name = "agent-groups"

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        names = sorted({a for a in trace.agents if a is not None})
        self._agent = {a: k for k, a in enumerate(names)}
        self._req_agent = [self._agent.get(a, -1) if a is not None else -1 for a in trace.agents]
        self._bit = [0 if a < 0 else 1 << a for a in self._req_agent]
        self._prev = [
            self._agent.get(p, -1) if p is not None else -1 for p in trace.previous_agents
        ]
        self._wf = list(trace.workflows)
        last: dict[str | None, int] = {}
        for i in np.argsort(np.asarray(trace.end_s, float), kind="stable").tolist():
            last[self._wf[i]] = i
        self._closes = {i: w for w, i in last.items() if w is not None}
        self._position: dict[str, int] = {}  # workflow in flight -> agent of its latest request
        self._mask = [0] * capacity
        self._group_of = [-1] * capacity
        self._tick = [0] * capacity
        self._clock = 0
        self._groups: dict[int, OrderedDict[int, None]] = {}
        self._n = 0
        self._keys: dict[int, int] = {}
        self._dirty = True

    def group_key(self, mask: int) -> int:
        raise NotImplementedError

    def refresh(self) -> None:
        """Recompute what `group_key` needs from the workflows in flight."""

    def start(self, i: int) -> None:
        w, a = self._wf[i], self._req_agent[i]
        if w is not None and a >= 0:
            self._position[w] = a
            self._dirty = True

    def finished(self, i: int) -> None:
        w = self._closes.get(i)
        if w is not None and self._position.pop(w, None) is not None:
            self._dirty = True

    def touched(self, i: int, blocks: list[int]) -> None:
        group_of, mask, bit, groups = self._group_of, self._mask, self._bit[i], self._groups
        for b in blocks:
            g = group_of[b]
            if g >= 0:
                od = groups[g]
                del od[b]
                if not od:
                    del groups[g]
                group_of[b] = -1
                self._n -= 1
            mask[b] |= bit

    def stored(self, i: int, blocks: list[int], j0: int) -> None:
        mask, bit = self._mask, self._bit[i]
        for b in blocks:
            mask[b] = bit

    def released(self, i: int, blocks: list[int]) -> None:
        mask, group_of, tick, groups = self._mask, self._group_of, self._tick, self._groups
        for b in blocks:
            m = mask[b]
            od = groups.get(m)
            if od is None:
                od = groups[m] = OrderedDict()
            od[b] = None
            group_of[b] = m
            self._clock += 1
            tick[b] = self._clock
        self._n += len(blocks)

    def _fresh(self) -> None:
        """The group keys forgotten once the workflows in flight changed."""
        if self._dirty:
            self.refresh()
            self._keys.clear()
            self._dirty = False

    def _key_of(self, g: int) -> int:
        self._fresh()
        k = self._keys.get(g)
        if k is None:
            k = self._keys[g] = self.group_key(g)
        return k

    def pop_many(self, m: int) -> list[int]:
        """`m` victims, those `pop` gives one at a time: nothing changes the keys in between,
        so the groups are taken by key, and those of equal key merged by release tick (each
        group is in tick order), not searched again for each block."""
        by_key: dict[int, list[OrderedDict[int, None]]] = {}
        for g, od in self._groups.items():
            by_key.setdefault(self._key_of(g), []).append(od)
        out: list[int] = []
        for k in sorted(by_key):
            ods = by_key[k]
            merged = ods[0] if len(ods) == 1 else heapq.merge(*ods, key=self._tick.__getitem__)
            out.extend(islice(merged, m - len(out)))
            if len(out) == m:
                break
        group_of, groups = self._group_of, self._groups
        for b in out:
            g = group_of[b]
            od = groups[g]
            del od[b]
            if not od:
                del groups[g]
            group_of[b] = -1
        self._n -= len(out)
        return out

    def pop(self) -> int:
        tick = self._tick
        best, best_g = None, -1
        for g, od in self._groups.items():
            cand = (self._key_of(g), tick[next(iter(od))])
            if best is None or cand < best:
                best, best_g = cand, g
        od = self._groups[best_g]
        b = od.popitem(last=False)[0]
        if not od:
            del self._groups[best_g]
        self._group_of[b] = -1
        self._n -= 1
        return b

    def __len__(self) -> int:
        return self._n


class StepsToExecutionOrder(AgentGroupOrder):
    """KVFlow: evict first the blocks whose agents run furthest ahead, in steps of the agent
    step graph (the successor relation previous_agent -> agent seen anywhere in the trace), from
    the positions of the workflows in flight. A block's steps are the least over its agents."""

    name = "steps-to-execution"

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        super().bind(trace, capacity, rank)
        n = len(self._agent)
        succ: list[set[int]] = [set() for _ in range(n)]
        for p, a in zip(self._prev, self._req_agent, strict=True):
            if p >= 0 and a >= 0:
                succ[p].add(a)
        self._dist = [self._bfs(succ, s) for s in range(n)]  # >= 1 step, FAR if unreachable
        self._steps = [FAR] * n

    @staticmethod
    def _bfs(succ: list[set[int]], s: int) -> list[int]:
        dist = [FAR] * len(succ)
        q = deque((a, 1) for a in succ[s])
        while q:
            a, d = q.popleft()
            if dist[a] <= d:
                continue
            dist[a] = d
            q.extend((b, d + 1) for b in succ[a])
        return dist

    def refresh(self) -> None:
        here = Counter(self._position.values())
        self._steps = [
            min((self._dist[p][a] for p in here), default=FAR) for a in self._agent.values()
        ]

    def group_key(self, mask: int) -> int:
        steps = [s for a, s in enumerate(self._steps) if mask >> a & 1]
        return -min(steps, default=FAR)


class PredictedNextAgentOrder(AgentGroupOrder):
    """PBKV-style: counts, learned online, of which agent followed each agent; the agents whose
    estimated probability of running next in a workflow in flight is >= `threshold` are
    predicted, and blocks any of them used are evicted only after all others (LRU otherwise,
    and plain LRU while nothing is predicted)."""

    name = "predicted-next-agent"

    def __init__(self, threshold: float = 0.5) -> None:
        self._threshold = threshold

    def bind(self, trace: Trace, capacity: int, rank: np.ndarray) -> None:
        super().bind(trace, capacity, rank)
        self._follow: list[Counter[int]] = [Counter() for _ in self._agent]
        self._protected = 0

    def start(self, i: int) -> None:
        p, a = self._prev[i], self._req_agent[i]
        if p >= 0 and a >= 0:
            self._follow[p][a] += 1
        super().start(i)

    def refresh(self) -> None:
        protected = 0
        for p in set(self._position.values()):
            seen = self._follow[p]
            total = sum(seen.values())
            for a, c in seen.items():
                if c >= self._threshold * total:
                    protected |= 1 << a
        self._protected = protected

    def group_key(self, mask: int) -> int:
        return 1 if mask & self._protected else 0
