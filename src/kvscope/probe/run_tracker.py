"""LangGraph's runs as they happen, seen through langchain-core's callbacks, for naming calls.

`RunTracker` is a callback handler that langchain-core adds to every run's callback manager while
it is active (`register_configure_hook`, the way LangSmith and MLflow attach). It keeps, for the
runs in flight, each run's parent and root, and per invocation (a root run: `graph.invoke(...)`,
or whatever runnable the app invoked around it) the LLM calls made so far, the supersteps of its
tasks at every graph level and the tool time not yet charged to a call. Runs are forgotten when
they end, invocations when their root ends; nothing is kept per thread.

Activation is process-wide (`activate()` / `deactivate()`), not a context variable: an app may
invoke its graphs from threads it started before profiling began, which a context variable would
not reach. The rules a call is named by are in probe/identity.py.
"""

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook

from kvscope.records.tools import ToolCall, tool_text

NS_SEP, NS_END = "|", ":"  # LangGraph's checkpoint namespace: `outer:<task>|inner:<task>`


@dataclass(frozen=True)
class CallPlace:
    """Where an LLM call sits in its invocation, as the tracker ordered it."""

    workflow_run_id: str
    step: int | None  # the invocation's top-level superstep
    turn_id: int | None
    previous_agent_id: str | None
    tool_ms: float | None


@dataclass
class _Run:
    parent: UUID | None
    root: UUID
    metadata: Mapping[str, Any]
    tool_name: str | None = None
    start_ns: int = 0
    tool_input: str | None = None


# Where a call sits, level by level from the root graph: (that level's superstep, its task as
# the checkpoint namespace down to that level). One level for a top-level node's call.
Place = tuple[tuple[int | None, str], ...]


@dataclass
class _Call:
    place: Place
    agent: str | None


@dataclass
class _Invocation:
    calls: list[_Call] = field(default_factory=list)
    # task (its namespace from the root: `outer:<id>`, `outer:<id>|inner:<id>`) -> its superstep
    task_steps: dict[str, int] = field(default_factory=dict)
    agent_steps: dict[str, set[int]] = field(default_factory=dict)
    tool_ms: dict[str | None, float] = field(default_factory=dict)  # task -> uncharged tool time


def outer_task(metadata: Mapping[str, Any]) -> str | None:
    """The top-level task (`node:<task id>`) a run belongs to, from its checkpoint namespace."""
    ns = metadata.get("langgraph_checkpoint_ns")
    return ns.split(NS_SEP)[0] if isinstance(ns, str) and ns else None


def task_path(metadata: Mapping[str, Any]) -> list[str]:
    """The tasks from the root graph down to the running node, each named by the namespace up
    to it: ["outer:<id>", "outer:<id>|inner:<id>"]; [] outside a graph."""
    ns = metadata.get("langgraph_checkpoint_ns")
    if not isinstance(ns, str) or not ns:
        return []
    parts = ns.split(NS_SEP)
    return [NS_SEP.join(parts[: i + 1]) for i in range(len(parts))]


def node_path(metadata: Mapping[str, Any]) -> list[str]:
    """The node names from the root graph down to the running node: ["outer", "inner"]."""
    ns = metadata.get("langgraph_checkpoint_ns")
    if isinstance(ns, str) and ns:
        return [part.split(NS_END)[0] for part in ns.split(NS_SEP)]
    node = metadata.get("langgraph_node")
    return [node] if isinstance(node, str) else []


class RunTracker(BaseCallbackHandler):
    """Callback handler keeping the run tree and each invocation's calls; thread-safe."""

    run_inline = True  # called in the caller's thread/task: a run is known before its code runs
    raise_error = False

    def __init__(self, on_tool: Callable[[ToolCall], None] | None = None) -> None:
        self.on_tool = on_tool
        self._lock = threading.Lock()
        self._runs: dict[UUID, _Run] = {}
        self._invocations: dict[UUID, _Invocation] = {}

    # --- callbacks -------------------------------------------------------------------------
    def on_chain_start(self, serialized: Any, inputs: Any, **kw: Any) -> None:
        self._start(kw["run_id"], kw.get("parent_run_id"), kw.get("metadata"))

    def on_chat_model_start(self, serialized: Any, messages: Any, **kw: Any) -> None:
        self._start(kw["run_id"], kw.get("parent_run_id"), kw.get("metadata"))

    def on_llm_start(self, serialized: Any, prompts: Any, **kw: Any) -> None:
        self._start(kw["run_id"], kw.get("parent_run_id"), kw.get("metadata"))

    def on_tool_start(self, serialized: Any, input_str: Any, **kw: Any) -> None:
        name = (serialized or {}).get("name") or kw.get("name") or "tool"
        given = kw.get("inputs") or input_str  # the structured inputs where langchain gives them
        self._start(kw["run_id"], kw.get("parent_run_id"), kw.get("metadata"), tool=name,
                    tool_input=tool_text(given))  # fmt: skip

    def on_chain_end(self, outputs: Any, **kw: Any) -> None:
        self._end(kw["run_id"])

    def on_chain_error(self, error: BaseException, **kw: Any) -> None:
        self._end(kw["run_id"])

    def on_llm_end(self, response: Any, **kw: Any) -> None:
        self._end(kw["run_id"])

    def on_llm_error(self, error: BaseException, **kw: Any) -> None:
        self._end(kw["run_id"])

    def on_tool_end(self, output: Any, **kw: Any) -> None:
        self._end(kw["run_id"], tool_error=None, output=tool_text(output))

    def on_tool_error(self, error: BaseException, **kw: Any) -> None:
        self._end(kw["run_id"], tool_error=type(error).__name__)

    # --- queries ---------------------------------------------------------------------------
    def place(
        self, run_id: UUID | None, metadata: Mapping[str, Any], agent_id: str | None
    ) -> CallPlace | None:
        """Register an LLM call made inside run `run_id` (with the node's `metadata`) by
        `agent_id`, and say where it sits; None when the run is not one the tracker saw."""
        with self._lock:
            run = self._runs.get(run_id) if run_id is not None else None
            if run is None or run.root not in self._invocations:
                return None
            inv = self._invocations[run.root]
            tasks = task_path(metadata)
            place = tuple((inv.task_steps.get(t), t) for t in tasks)
            if place and place[-1][0] is None:  # the node's own step, from the call's metadata
                place = (*place[:-1], (metadata.get("langgraph_step"), tasks[-1]))
            step = place[0][0] if place else None  # the invocation's top-level superstep
            previous = _previous(inv.calls, place)
            turn = None
            if agent_id is not None and step is not None:
                steps = inv.agent_steps.setdefault(agent_id, set())
                steps.add(step)
                turn = len(steps)
            inv.calls.append(_Call(place, agent_id))
            tool_ms = inv.tool_ms.pop(outer_task(metadata), None)
            return CallPlace(str(run.root), step, turn, previous, tool_ms)

    # --- bookkeeping -----------------------------------------------------------------------
    def _start(
        self,
        run_id: UUID,
        parent: UUID | None,
        metadata: Mapping[str, Any] | None,
        tool: str | None = None,
        tool_input: str | None = None,
    ) -> None:
        md = metadata or {}
        with self._lock:
            up = self._runs.get(parent) if parent is not None else None
            root = up.root if up is not None else run_id
            self._runs[run_id] = _Run(
                parent, root, md, tool, time.time_ns() if tool else 0, tool_input
            )
            if parent is None:
                self._invocations[run_id] = _Invocation()
            inv = self._invocations.get(root)
            ns = md.get("langgraph_checkpoint_ns")
            if inv is not None and isinstance(ns, str) and ns and "langgraph_step" in md:
                inv.task_steps.setdefault(ns, md["langgraph_step"])  # a node (any level) starts

    def _end(self, run_id: UUID, tool_error: str | None = None, output: str | None = None) -> None:
        with self._lock:
            run = self._runs.pop(run_id, None)
            if run is None:
                return
            if run.parent is None:
                self._invocations.pop(run_id, None)
            if run.tool_name is None:
                return
            end_ns = time.time_ns()
            inv = self._invocations.get(run.root)
            task = outer_task(run.metadata)
            if inv is not None:
                ms = (end_ns - run.start_ns) / 1e6
                inv.tool_ms[task] = inv.tool_ms.get(task, 0.0) + ms
        if self.on_tool is not None:
            path = node_path(run.metadata)
            workflow = str(run.root) if inv is not None and run.root != run_id else None
            self.on_tool(
                ToolCall(
                    run.tool_name,
                    workflow,
                    "/".join(path) or None,
                    run.start_ns,
                    end_ns,
                    tool_error,
                    run.tool_input,
                    output,
                )
            )


def _previous(calls: list[_Call], place: Place) -> str | None:
    """The agent of the latest call that happened before a call at `place` (see `_before`);
    None when none did."""
    for call in reversed(calls):
        if _before(call.place, place):
            return call.agent
    return None


def _before(earlier: Place, now: Place) -> bool:
    """Whether a call registered earlier, at `earlier`, happened before one at `now` in the
    graph's order. At the first level where their tasks differ: an earlier superstep there did;
    the same superstep is a parallel branch (a `Send` fan-out, at any depth), which did not.
    Tasks the same down to where one path ends: the same node, or one inside the other: it did.
    A superstep not known at that level (outside a graph): time order."""
    for (step_a, task_a), (step_b, task_b) in zip(earlier, now, strict=False):
        if task_a == task_b:
            continue
        if step_a is None or step_b is None:
            return True
        return step_a < step_b
    return True


class _Slot:
    """The active tracker, process-wide. langchain-core's configure hook only calls `.get()`."""

    def __init__(self) -> None:
        self.tracker: RunTracker | None = None
        self.users = 0
        self.lock = threading.Lock()

    def get(self) -> RunTracker | None:
        return self.tracker


_SLOT = _Slot()
register_configure_hook(cast(Any, _SLOT), inheritable=True)


def activate(on_tool: Callable[[ToolCall], None] | None = None) -> RunTracker:
    """Attach the process's tracker to every LangChain run from now on (re-entrant: each
    activate() needs its deactivate(); the first one's `on_tool` is kept)."""
    with _SLOT.lock:
        if _SLOT.tracker is None:
            _SLOT.tracker = RunTracker(on_tool)
        _SLOT.users += 1
        return _SLOT.tracker


def deactivate() -> None:
    with _SLOT.lock:
        _SLOT.users = max(_SLOT.users - 1, 0)
        if _SLOT.users == 0:
            _SLOT.tracker = None


def active() -> RunTracker | None:
    return _SLOT.get()
