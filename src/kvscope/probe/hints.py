"""Eviction hints: each call's engine priority set from the workflow, so that an unmodified
SGLang (`--radix-eviction-policy priority`) evicts the prefixes needed latest first.

    hints = make_hints("steps-to-execution")   # None for "none"
    priority = hints(identity)                  # an even int >= 2, once per call, at its send

What the engine does with it (SGLang 0.5.23; mem_cache/evict_policy.py PriorityStrategy, the
unified radix tree's insert, unified_radix_cache.checkpoint_into_tree): `priority` is a
top-level int of the request body, kept with priority scheduling off. Every insert (a prompt at
the end of its prefill; prompt and output at the request's finish) sets each node on its path
to max(its priority, the request's); nothing lowers it. Eviction takes the unlocked leaf with
the smallest (priority, last access). At a request's finish its prompt path is inserted again
at priority + 1, so its output goes before its prompt. So a hint acts when a call's prefix is
inserted and a node keeps the highest level any call gave it: a hint is a level, not a
deadline. Levels are even, so a finished prompt's + 1 stays inside its level.

The policies rank an agent by how soon its prefix is needed again, at the call's send:
- `steps-to-execution` (KVFlow): s = the fewest steps from any in-flight workflow's current
  agent to this agent, over the agent graph learned from the calls so far (previous agent ->
  agent edges, as steps-to-execution replays it: sim/orders/workflow.py); the calling workflow
  counts from this agent, so a strict cycle gives every agent its cycle length. Sooner is higher.
- `predicted-next` (PBKV): p = the largest probability, over in-flight workflows, that this
  agent is the next one after the workflow's current agent (order-1 counts of the calls so
  far, as predicted-next-agent replays it). Likelier is higher.
Ties (a strict cycle with one workflow in flight: every agent equally far) are broken by the
agents' order of first appearance, the earlier first. That keeps a fixed ranking of the
prefixes where LRU would cycle through them all: in a cyclic pathology whose cache holds all
prefixes but one, the bottom-ranked prefixes are recomputed, the others stay.

A workflow is in flight from its first call until it has made no call for `idle_s` (an
invocation's end is not seen here). The state is per process and thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import get_args

from kvscope.config import HintPolicy
from kvscope.probe.identity import CallIdentity

POLICIES: tuple[str, ...] = get_args(HintPolicy)
START = "start"  # the previous agent of a workflow's first call
MAX_STEPS = 16  # farther, or never reached again: all the same
MAX_AGENTS = 64  # agents ranked by first appearance; later ones share the last rank
PROBABILITY_LEVELS = 16  # predicted-next: a probability in [0, 1] as this many levels

Hints = Callable[[CallIdentity], int]


class _Workflows:
    """The agent graph and the in-flight workflows' positions, learned from the calls."""

    def __init__(self, idle_s: float, clock: Callable[[], float]) -> None:
        self.idle_s, self.clock = idle_s, clock
        self.follow: dict[str, Counter[str]] = {}  # previous agent -> its followers, counted
        self.order: dict[str, int] = {}  # agent -> rank of first appearance
        self.at: OrderedDict[str, tuple[str, float]] = OrderedDict()  # workflow -> (agent, when)
        self.lock = threading.Lock()

    def see(self, ident: CallIdentity) -> tuple[str, list[str]]:
        """Learn from the call; (its agent, the current agents of the other in-flight
        workflows)."""
        agent = ident.agent_id or ""
        now = self.clock()
        self.order.setdefault(agent, len(self.order))
        self.follow.setdefault(ident.previous_agent_id or START, Counter())[agent] += 1
        key = ident.workflow_run_id or ident.thread_id or ""
        while self.at and now - next(iter(self.at.values()))[1] > self.idle_s:
            self.at.popitem(last=False)  # the longest idle first
        self.at.pop(key, None)
        others = [a for a, _ in self.at.values()]
        self.at[key] = (agent, now)
        return agent, others

    def rank(self, agent: str) -> int:
        """0 for the first agent seen, then 1, ...: higher is kept longer (MAX_AGENTS - ...)."""
        return MAX_AGENTS - 1 - min(self.order.get(agent, MAX_AGENTS - 1), MAX_AGENTS - 1)

    def steps(self, source: str, target: str) -> int:
        """The fewest edges from `source` to `target` (at least 1: back to itself is a cycle);
        MAX_STEPS when it is not reached within that."""
        frontier, seen = deque([(source, 0)]), {source: 0}
        while frontier:
            node, d = frontier.popleft()
            if d >= MAX_STEPS:
                break
            for nxt in self.follow.get(node, ()):
                if nxt == target:
                    return d + 1
                if nxt not in seen:
                    seen[nxt] = d + 1
                    frontier.append((nxt, d + 1))
        return MAX_STEPS

    def probability(self, source: str, target: str) -> float:
        counts = self.follow.get(source)
        total = sum(counts.values()) if counts else 0
        return counts[target] / total if total else 0.0


def _level(urgency: int, rank: int) -> int:
    """An even priority >= 2: urgency first, then the agent's rank (both: higher is kept)."""
    return 2 * (1 + urgency * MAX_AGENTS + rank)


def make_hints(
    policy: HintPolicy | None, idle_s: float = 120.0, clock: Callable[[], float] = time.monotonic
) -> Hints | None:
    """The policy's per-call priority; None for "none" (no field is sent)."""
    if policy in (None, "none"):
        return None
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction hint policy {policy!r}; one of {', '.join(POLICIES)}")
    flows = _Workflows(idle_s, clock)

    def steps_to_execution(ident: CallIdentity) -> int:
        with flows.lock:
            agent, others = flows.see(ident)
            s = min([flows.steps(agent, agent), *(flows.steps(o, agent) for o in others)])
            return _level(MAX_STEPS - s, flows.rank(agent))

    def predicted_next(ident: CallIdentity) -> int:
        with flows.lock:
            agent, others = flows.see(ident)
            p = max([flows.probability(agent, agent),
                     *(flows.probability(o, agent) for o in others)])  # fmt: skip
            return _level(round(p * (PROBABILITY_LEVELS - 1)), flows.rank(agent))

    return steps_to_execution if policy == "steps-to-execution" else predicted_next
