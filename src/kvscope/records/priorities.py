"""Eviction priority levels from a workflow's calls: the integer each call is given, in the order
the calls are made, so that SGLang's priority eviction keeps the prefixes needed soonest.

    levels = make_levels("steps-to-execution")
    priority = levels(agent, previous_agent, workflow, now)   # an even int >= 2, once per call

One definition for both sides: the probe sends it with each call (probe/hints.py, `now` its
clock at the send) and the replay computes it offline over a trace's calls in their start order
(`now` the call's start: sim/hints.py). Pure: no clock, no thread, no I/O; the caller
serialises the calls (the probe holds a lock).

The policies rank an agent by how soon its prefix is needed again, at the call:
- `steps-to-execution` (KVFlow): s = the fewest steps from any in-flight workflow's current
  agent to this agent, over the agent graph learned from the calls so far (previous agent ->
  agent edges, as steps-to-execution replays it: sim/orders/workflow.py); the calling workflow
  counts from this agent, so a strict cycle gives every agent its cycle length. Sooner is higher.
- `predicted-next` (PBKV): p = the largest probability, over in-flight workflows, that this
  agent is the next one after the workflow's current agent (order-1 counts of the calls so
  far, as predicted-next-agent replays it). Likelier is higher.
Ties (a strict cycle with one workflow in flight: every agent equally far) are broken by the
agents' order of first appearance, the earlier first. Levels are even (SGLang re-inserts a
finished prompt at priority + 1, which must stay inside its level).

A workflow is in flight from its first call until it has made no call for `idle_s` (an
invocation's end is not seen by the probe, so the offline form does not use it either).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Literal, get_args

# The config's eviction_hints (kvscope.config re-exports it: records imports no other package)
HintPolicy = Literal["none", "steps-to-execution", "predicted-next"]
LEVEL_POLICIES: tuple[str, ...] = tuple(p for p in get_args(HintPolicy) if p != "none")
IDLE_S = 120.0  # a workflow with no call for this long is no longer in flight
START = "start"  # the previous agent of a workflow's first call
MAX_STEPS = 16  # farther, or never reached again: all the same
MAX_AGENTS = 64  # agents ranked by first appearance; later ones share the last rank
PROBABILITY_LEVELS = 16  # predicted-next: a probability in [0, 1] as this many levels

# (agent, previous agent, workflow, now in seconds) -> the call's priority
Levels = Callable[[str | None, str | None, str | None, float], int]


class Workflows:
    """The agent graph and the in-flight workflows' positions, learned from the calls."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.follow: dict[str, Counter[str]] = {}  # previous agent -> its followers, counted
        self.order: dict[str, int] = {}  # agent -> rank of first appearance
        self.at: OrderedDict[str, tuple[str, float]] = OrderedDict()  # workflow -> (agent, when)

    def see(
        self, agent: str | None, previous: str | None, workflow: str | None, now: float
    ) -> tuple[str, list[str]]:
        """Learn from the call; (its agent, the current agents of the other in-flight
        workflows)."""
        agent = agent or ""
        self.order.setdefault(agent, len(self.order))
        self.follow.setdefault(previous or START, Counter())[agent] += 1
        key = workflow or ""
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


def level(urgency: int, rank: int) -> int:
    """An even priority >= 2: urgency first, then the agent's rank (both: higher is kept)."""
    return 2 * (1 + urgency * MAX_AGENTS + rank)


def make_levels(policy: str, idle_s: float = IDLE_S) -> Levels:
    """The policy's per-call priority, fresh state (one per process, or per replayed trace)."""
    if policy not in LEVEL_POLICIES:
        raise ValueError(f"unknown eviction hint policy {policy!r}; one of {LEVEL_POLICIES}")
    flows = Workflows(idle_s)

    def steps_to_execution(
        agent: str | None, previous: str | None, workflow: str | None, now: float
    ) -> int:
        me, others = flows.see(agent, previous, workflow, now)
        s = min([flows.steps(me, me), *(flows.steps(o, me) for o in others)])
        return level(MAX_STEPS - s, flows.rank(me))

    def predicted_next(
        agent: str | None, previous: str | None, workflow: str | None, now: float
    ) -> int:
        me, others = flows.see(agent, previous, workflow, now)
        p = max([flows.probability(me, me), *(flows.probability(o, me) for o in others)])
        return level(round(p * (PROBABILITY_LEVELS - 1)), flows.rank(me))

    return steps_to_execution if policy == "steps-to-execution" else predicted_next


def next_agent_accuracy(calls: Iterable[tuple[str | None, str | None]]) -> float | None:
    """How often the hints' predictor named the agent that came: over (agent, previous agent)
    in call order, the share of calls whose agent was the most frequent follower of their
    previous agent among the calls before (ties: the follower seen first), as predicted-next
    ranks them; None when no call had a prediction (its previous agent never seen before)."""
    follow: dict[str, Counter[str]] = {}
    predicted = hits = 0
    for agent, previous in calls:
        seen = follow.setdefault(previous or START, Counter())
        if seen:
            predicted += 1
            hits += seen.most_common(1)[0][0] == (agent or "")
        seen[agent or ""] += 1
    return hits / predicted if predicted else None
