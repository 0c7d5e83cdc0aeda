"""The order of one invocation's LLM calls, as the RunTracker (probe/run_tracker.py) keeps it:
which call happened before which (previous_agent_id) and which visit of its agent a call is
(turn_id). The rules are stated in probe/identity.py; this module holds the invocation's state
and the comparisons.

Graph nodes are ordered by LangGraph's supersteps, level by level. The Functional API's tasks
(`@task`) are not: a task runs while its caller goes on, all of a caller's tasks share its
superstep. They are ordered on the invocation's own event clock (`Invocation.tick`): a task's
start is when its caller launched it (probe/task_launches.py; when its run started, where the
launch was not seen), its end when its run ended; one task is before another when it ended
before the other was launched.
"""

from dataclasses import dataclass, field
from uuid import UUID

# Where a call sits, level by level from the root graph: (that level's superstep, its task as
# the checkpoint namespace down to that level). One level for a top-level node's call.
Place = tuple[tuple[int | None, str], ...]


@dataclass
class PlacedCall:
    place: Place
    agent: str | None


@dataclass
class TaskSpan:
    """A functional-API task on its invocation's event clock; end None: running."""

    start: int
    end: int | None = None


@dataclass
class Invocation:
    """What the tracker keeps of one invocation (a root run) while it runs."""

    calls: list[PlacedCall] = field(default_factory=list)
    # task (its namespace from the root: `outer:<id>`, `outer:<id>|inner:<id>`) -> its superstep
    task_steps: dict[str, int] = field(default_factory=dict)
    agent_steps: dict[str, set[int]] = field(default_factory=dict)
    tool_ms: dict[str | None, float] = field(default_factory=dict)  # task -> uncharged tool time
    clock: int = 0  # counts the functional tasks' launches and ends
    call_tasks: dict[str, TaskSpan] = field(default_factory=dict)  # `@task`s by namespace
    task_runs: dict[UUID, str] = field(default_factory=dict)  # a task's own run -> namespace
    launches: dict[str, list[int]] = field(default_factory=dict)  # caller ns -> launch ticks
    entrypoints: set[str] = field(default_factory=set)  # top-level tasks that are @entrypoints
    visits: dict[tuple[str, str], int] = field(default_factory=dict)  # (agent, task) -> turn

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def task_started(self, run_id: UUID, ns: str, caller: str, index: object) -> None:
        """A `@task`'s own run starts (again, for a retry): its span from its launch, the
        `index`-th task call of its `caller` (namespace), else from now."""
        launched = self.launches.get(caller, [])
        at = launched[index] if isinstance(index, int) and 0 <= index < len(launched) else None
        span = self.call_tasks.setdefault(ns, TaskSpan(at if at is not None else self.tick()))
        span.end = None
        self.task_runs[run_id] = ns

    def run_ended(self, run_id: UUID) -> None:
        if (ns := self.task_runs.pop(run_id, None)) is not None:
            self.call_tasks[ns].end = self.tick()

    def entry_task(self, tasks: list[str]) -> str | None:
        """The `@task` a call at `tasks` (the namespaces down to its node) runs in right under
        an @entrypoint; None for any other call."""
        if len(tasks) > 1 and tasks[0] in self.entrypoints and tasks[1] in self.call_tasks:
            return tasks[1]
        return None

    def task_turn(self, agent: str, task: str) -> int:
        """The turn of `agent`'s calls in `task`, an @entrypoint's `@task`: 1 + the latest turn
        of the agent's tasks that ended before this one was launched (tasks launched together
        share one)."""
        if (turn := self.visits.get((agent, task))) is None:
            start = self.call_tasks[task].start
            ended = [
                t
                for (a, other), t in self.visits.items()
                if a == agent and (end := self.call_tasks[other].end) is not None and end < start
            ]
            turn = self.visits[(agent, task)] = 1 + max(ended, default=0)
        return turn

    def previous(self, place: Place) -> str | None:
        """The agent of the latest call that happened before a call at `place` (`before`);
        None when none did."""
        for call in reversed(self.calls):
            if before(call.place, place, self.call_tasks):
                return call.agent
        return None


def before(earlier: Place, now: Place, tasks: dict[str, TaskSpan]) -> bool:
    """Whether a call registered earlier, at `earlier`, happened before one at `now` in the
    graph's order. At the first level where their tasks differ: an earlier superstep there did;
    the same superstep is a parallel branch (a `Send` fan-out, at any depth), which did not.
    Functional-API tasks (`tasks`, by namespace) run while their caller goes on, so there the
    earlier call's task must have ended: before the other's task was launched (tasks launched
    together, futures gathered, are parallel), or before a call of the caller's own code.
    Tasks the same down to where one path ends: the same node, or one inside the other: it did.
    A superstep not known at that level (outside a graph): time order."""
    for (step_a, task_a), (step_b, task_b) in zip(earlier, now, strict=False):
        if task_a == task_b:
            continue
        if (span_a := tasks.get(task_a)) is not None:
            span_b = tasks.get(task_b)
            return span_a.end is not None and (span_b is None or span_a.end < span_b.start)
        if step_a is None or step_b is None or task_b in tasks:
            return True
        return step_a < step_b
    if len(earlier) > len(now) and (span := tasks.get(earlier[len(now)][1])) is not None:
        return span.end is not None
    return True
