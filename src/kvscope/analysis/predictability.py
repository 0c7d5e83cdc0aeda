"""Next-agent predictability: what a workflow-aware cache could know about which prefix comes next.

Definitions (over the request table's rows; calls with no workflow_run_id or no agent_id are left
out: they belong to no agent sequence):

- A visit is one agent's turn in one workflow run: its calls with the same (workflow_run_id,
  agent_id, turn_id) (a call with a null turn_id is a visit of its own). Its start is its first
  call's start_ns, its end its last call's end_ns.
- A step is a group of concurrent visits: the workflow's visits sorted by start, a visit joins
  the current step when it starts before every visit of that step has ended (parallel `Send`
  branches of a fan-out); otherwise it opens the next step.
- The agent sequence of a workflow: its visits step by step, the visits of one step by agent
  name, so a fan-out reads dispatcher, branches (by name), join. Positions in it are "steps
  ahead" below (one per visit, a branch counts as one).
- Step edges: every visit of a step -> every visit of the next step ("start" -> the first
  step), counted once per workflow occurrence. Unlike previous_agent_id, this shows both a
  fan-out (dispatcher -> each branch) and a join (each branch -> the join agent).
- Reuse distance of a visit of agent A: the positions and the seconds (this visit's end to the
  start of A's next visit) until A's next visit in the same workflow; a visit after which A does
  not come back in its workflow has none (`no_return`). Across workflows is not measured.
- The predictor (order-`history` Markov with back-off): for the workflows in order of their
  first call, each position i of a sequence predicts the agent at i + k (k = 1, 2, 3) as the one
  that most often came k positions after the same last-`history` agents (else fewer, down to the
  last one) in the sequences of the workflows that started earlier (their whole sequences: an
  upper bound on what a cache could know when workflows overlap). Ties: the agent seen first.
  accuracy_k = correct / predicted over the positions with an agent k ahead and something to
  predict from; null (never 0) when nothing was predicted.
"""

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from kvscope.analysis.agents import percentile
from kvscope.records.agents import AgentOrder, agent_key, agent_order
from kvscope.records.base import Row

START = "start"
ALL = "all"
AHEAD = (1, 2, 3)
VALUES = ("steps", "seconds", "any_seconds")  # ReuseDistance's value lists (not in tables)


@dataclass(frozen=True)
class Visit:
    workflow_run_id: str
    agent_id: str
    turn_id: int | None
    start_ns: int
    end_ns: int
    calls: int
    step: int = 0  # its step in the workflow, from 0


@dataclass(frozen=True)
class SequenceCount:
    sequence: tuple[str, ...]
    workflows: int


@dataclass(frozen=True)
class ReuseDistance:
    agent_id: str
    visits: int
    returns: int  # visits after which the agent came back in the same workflow
    no_return: int
    steps_p50: float | None
    steps_p95: float | None
    steps_max: int | None
    seconds_p50: float | None
    seconds_p95: float | None
    seconds_max: float | None
    any_seconds_p50: float | None  # to the next visit in any workflow run
    any_seconds_p95: float | None
    steps: tuple[int, ...] = field(repr=False)  # the values, for a plot
    seconds: tuple[float, ...] = field(repr=False)
    any_seconds: tuple[float, ...] = field(repr=False)


@dataclass(frozen=True)
class Accuracy:
    agent_id: str  # the agent at the position predicted from; "all" = every position
    positions: int  # positions with an agent 1 ahead
    predicted_1: int
    accuracy_1: float | None
    predicted_2: int
    accuracy_2: float | None
    predicted_3: int
    accuracy_3: float | None


@dataclass(frozen=True)
class Predictability:
    workflows: int
    sequences: list[SequenceCount]  # most frequent first
    edges: dict[tuple[str, str], int]  # step edges (from, to) -> occurrences
    reuse: list[ReuseDistance]  # per agent, in the run's agent order
    accuracy: list[Accuracy]  # per agent, then "all"
    history: int
    longer: Accuracy | None = None  # "all" with history + 1 (back-off to `history`)

    @property
    def distinct_sequences(self) -> int:
        return len(self.sequences)

    def summary(self) -> dict[str, Any]:
        """The numbers for summary.json (no per-value lists)."""
        return {
            "workflows": self.workflows,
            "distinct_sequences": self.distinct_sequences,
            "history": self.history,
            "sequences": [
                {"sequence": list(s.sequence), "workflows": s.workflows}
                for s in self.sequences[:10]
            ],
            "reuse": [{k: v for k, v in r.__dict__.items() if k not in VALUES} for r in self.reuse],
            "accuracy": [a.__dict__ for a in self.accuracy],
            "accuracy_longer_history": self.longer.__dict__ if self.longer else None,
        }


def visits(rows: Sequence[Row]) -> dict[str, list[Visit]]:
    """Per workflow run (in order of its first call), its visits in sequence order, each with
    its step (see the module docstring)."""
    # (workflow, agent, turn or the row's index) -> [first call's turn, start, end, calls]
    groups: dict[tuple[str, str, Any], list[Any]] = {}
    for i, r in enumerate(rows):
        wf, agent = r.get("workflow_run_id"), r.get("agent_id")
        if wf is None or agent is None:
            continue
        turn = r.get("turn_id")
        key = (wf, agent, ("turn", turn) if turn is not None else i)
        visit = groups.get(key)
        if visit is None:
            groups[key] = [turn, r["start_ns"], r["end_ns"], 1]
        else:
            visit[1] = min(visit[1], r["start_ns"])
            visit[2] = max(visit[2], r["end_ns"])
            visit[3] += 1
    raw: dict[str, list[tuple[str, list[Any]]]] = defaultdict(list)
    for (wf, agent, _), visit in groups.items():
        raw[wf].append((agent, visit))
    out = {wf: _steps(wf, vs) for wf, vs in raw.items()}
    return dict(sorted(out.items(), key=lambda kv: (kv[1][0].start_ns, kv[0])))


def _steps(wf: str, vs: list[tuple[str, list[Any]]]) -> list[Visit]:
    """A workflow's visits ((agent, [turn, start, end, calls]) stable-sorted by start) grouped
    into steps of concurrent visits, by agent inside."""
    steps: list[list[tuple[str, list[Any]]]] = []
    end = 0  # the least end of the current step's visits
    for v in sorted(vs, key=lambda v: v[1][1]):
        if steps and v[1][1] < end:
            steps[-1].append(v)
            end = min(end, v[1][2])
        else:
            steps.append([v])
            end = v[1][2]
    return [
        Visit(wf, agent, turn, start, stop, calls, n)
        for n, step in enumerate(steps)
        for agent, (turn, start, stop, calls) in sorted(step, key=lambda v: (v[0], v[1][1]))
    ]


def sequences(by_workflow: dict[str, list[Visit]]) -> list[SequenceCount]:
    """Distinct agent sequences with the number of workflows of each, most frequent first (ties:
    first seen first)."""
    counts = Counter(tuple(v.agent_id for v in vs) for vs in by_workflow.values())
    return [SequenceCount(s, n) for s, n in counts.most_common()]


def edges(by_workflow: dict[str, list[Visit]]) -> dict[tuple[str, str], int]:
    """Step edges (from, to) -> occurrences: "start" -> each first-step visit, then every visit of
    a step -> every visit of the next step (fan-out and join edges included)."""
    out: Counter[tuple[str, str]] = Counter()
    for vs in by_workflow.values():
        previous = [START]
        for n in range(vs[-1].step + 1 if vs else 0):
            step = [v.agent_id for v in vs if v.step == n]
            out.update((a, b) for a in previous for b in step)
            previous = step
    return dict(out)


def reuse_distance(by_workflow: dict[str, list[Visit]], order: AgentOrder) -> list[ReuseDistance]:
    """Per agent (in `order`), the positions and seconds until its next visit in the workflow."""
    steps: dict[str, list[int]] = defaultdict(list)
    secs: dict[str, list[float]] = defaultdict(list)
    count: Counter[str] = Counter()
    for vs in by_workflow.values():
        for i, v in enumerate(vs):
            count[v.agent_id] += 1
            j = next((j for j in range(i + 1, len(vs)) if vs[j].agent_id == v.agent_id), None)
            if j is not None:
                steps[v.agent_id].append(j - i)
                secs[v.agent_id].append(max(vs[j].start_ns - v.end_ns, 0) / 1e9)
    anywhere = _any_workflow(by_workflow)
    out = []
    for agent in sorted(count, key=agent_key(order)):
        st, sc, an = steps[agent], secs[agent], anywhere[agent]
        out.append(ReuseDistance(
            agent, count[agent], len(st), count[agent] - len(st),
            percentile(st, 50), percentile(st, 95), max(st, default=None),
            percentile(sc, 50), percentile(sc, 95), max(sc, default=None),
            percentile(an, 50), percentile(an, 95), tuple(st), tuple(sc), tuple(an),
        ))  # fmt: skip
    return out


def _any_workflow(by_workflow: dict[str, list[Visit]]) -> dict[str, list[float]]:
    """Per agent, seconds from each visit's end to the agent's next visit in any workflow."""
    mine: dict[str, list[Visit]] = defaultdict(list)
    for vs in by_workflow.values():
        for v in vs:
            mine[v.agent_id].append(v)
    out: dict[str, list[float]] = defaultdict(list)
    for agent, vs in mine.items():
        vs.sort(key=lambda v: v.start_ns)
        for v, nxt in pairwise(vs):
            out[agent].append(max(nxt.start_ns - v.end_ns, 0) / 1e9)
    return out


class Followers:
    """What came k positions after each context (a tuple of the last agents), counted, with its
    most frequent follower kept as counts grow (ties: the one counted first, as max() over the
    counts in insertion order), so a prediction is a lookup."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, ...], dict[str, int]] = {}
        self.best: dict[tuple[str, ...], str] = {}

    def add(self, context: tuple[str, ...], follower: str) -> None:
        counts = self.counts.setdefault(context, {})
        n = counts.get(follower, 0) + 1
        counts[follower] = n
        best = self.best.get(context)
        if best is None or n > counts[best]:
            self.best[context] = follower
        elif n == counts[best] and best != follower:  # a tie: the one counted first
            self.best[context] = next(a for a in counts if a in (best, follower))

    def predict(self, seq: Sequence[str], i: int, history: int) -> str | None:
        """The most frequent follower of the longest known suffix (up to `history`) of
        seq[: i + 1]."""
        for h in range(min(history, i + 1), 0, -1):
            best = self.best.get(tuple(seq[i + 1 - h : i + 1]))
            if best is not None:
                return best
        return None


def accuracy(
    by_workflow: dict[str, list[Visit]], order: AgentOrder, history: int = 1
) -> list[Accuracy]:
    """The online predictor's accuracy 1, 2 and 3 positions ahead, per agent and "all"."""
    learned = {k: Followers() for k in AHEAD}
    # agent -> [positions, predicted_1, hit_1, predicted_2, hit_2, predicted_3, hit_3]
    tally: dict[str, list[int]] = {}
    every = tally.setdefault(ALL, [0] * 7)
    for vs in by_workflow.values():
        seq = [v.agent_id for v in vs]
        for i, agent in enumerate(seq):
            mine = tally.setdefault(agent, [0] * 7)
            ahead = i + 1 < len(seq)
            mine[0] += ahead
            every[0] += ahead
            for k in AHEAD:
                if i + k >= len(seq):
                    break
                guess = learned[k].predict(seq, i, history)
                if guess is None:
                    continue
                hit = guess == seq[i + k]
                mine[2 * k - 1] += 1
                mine[2 * k] += hit
                every[2 * k - 1] += 1
                every[2 * k] += hit
        for k in AHEAD:  # learn this workflow only after it was predicted
            for i in range(len(seq) - k):
                for h in range(1, min(history, i + 1) + 1):
                    learned[k].add(tuple(seq[i + 1 - h : i + 1]), seq[i + k])
    agents = sorted((a for a in tally if a != ALL), key=agent_key(order))
    if not by_workflow or not any(vs for vs in by_workflow.values()):
        return []
    return [_accuracy(a, tally[a]) for a in (*agents, ALL)]


def _accuracy(agent: str, t: list[int]) -> Accuracy:
    def acc(k: int) -> float | None:
        return t[2 * k] / t[2 * k - 1] if t[2 * k - 1] else None

    return Accuracy(agent, t[0], t[1], acc(1), t[3], acc(2), t[5], acc(3))


def predictability(rows: Sequence[Row], history: int = 1) -> Predictability:
    """Every predictability view of a run's request rows (see the module docstring); `longer`
    is the "all" accuracy of the predictor with history + 1, labelled so."""
    order = agent_order(rows)
    by_workflow = visits(rows)
    longer = accuracy(by_workflow, order, history + 1)[-1:] if by_workflow else []
    return Predictability(
        workflows=len(by_workflow),
        sequences=sequences(by_workflow),
        edges=edges(by_workflow),
        reuse=reuse_distance(by_workflow, order),
        accuracy=accuracy(by_workflow, order, history),
        history=history,
        longer=replace(longer[0], agent_id=f"{ALL}, last {history + 1}") if longer else None,
    )
