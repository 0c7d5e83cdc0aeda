"""LangGraph's runs as they happen, seen through langchain-core's callbacks, for naming calls.

`RunTracker` is a callback handler that langchain-core adds to every run's callback manager while
it is active (`register_configure_hook`, the way LangSmith and MLflow attach). It keeps, for the
runs in flight, each run's parent and root, and per invocation (a root run: `graph.invoke(...)`,
or whatever runnable the app invoked around it) the LLM calls made so far, the supersteps of its
tasks at every graph level, the Functional API's tasks (`@task`: when each was launched and
ended, on the invocation's own event clock: probe/call_order.py, probe/task_launches.py) and the
tool time not yet charged to a call. Runs are forgotten when they end, invocations when their
root ends (one that raised is handed to `on_error` first: records/invocations.py); nothing is
kept per thread.

Activation is process-wide (`activate()` / `deactivate()`), not a context variable: an app may
invoke its graphs from threads it started before profiling began, which a context variable would
not reach. The rules a call is named by are in probe/identity.py.
"""

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from kvscope.probe import task_launches
from kvscope.probe.call_order import Invocation, PlacedCall
from kvscope.probe.langchain_context import BaseCallbackHandler, register_configure_hook
from kvscope.records.invocations import InvocationError, error_text
from kvscope.records.tools import ToolCall, tool_text

NS_SEP, NS_END = "|", ":"  # LangGraph's checkpoint namespace: `outer:<task>|inner:<task>`
NS_KEY = "langgraph_checkpoint_ns"
PUSH, START = "__pregel_push", "__start__"  # langgraph.constants (langgraph/_internal)
# Exceptions LangGraph raises to pause or redirect a run, not failures (langgraph.errors)
_BUBBLE_UP = ("GraphBubbleUp", "GraphInterrupt", "NodeInterrupt", "ParentCommand")


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


def is_call_task(metadata: Mapping[str, Any]) -> bool:
    """Whether the running task is a functional-API `@task` call (its path: (PUSH, the caller's
    path, the call's index, True)), not a node or a `Send`."""
    path = metadata.get("langgraph_path")
    return isinstance(path, tuple) and len(path) == 4 and path[0] == PUSH and path[3] is True


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

    def __init__(
        self,
        on_tool: Callable[[ToolCall], None] | None = None,
        on_error: Callable[[InvocationError], None] | None = None,
    ) -> None:
        self.on_tool, self.on_error = on_tool, on_error
        self._lock = threading.Lock()
        self._runs: dict[UUID, _Run] = {}
        self._invocations: dict[UUID, Invocation] = {}

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
        self._end(kw["run_id"], error=error)

    def on_llm_end(self, response: Any, **kw: Any) -> None:
        self._end(kw["run_id"])

    def on_llm_error(self, error: BaseException, **kw: Any) -> None:
        self._end(kw["run_id"])

    def on_tool_end(self, output: Any, **kw: Any) -> None:
        self._end(kw["run_id"], tool_error=None, output=tool_text(output))

    def on_tool_error(self, error: BaseException, **kw: Any) -> None:
        self._end(kw["run_id"], tool_error=type(error).__name__)

    # --- queries ---------------------------------------------------------------------------
    def task_agent(self, run_id: UUID | None, metadata: Mapping[str, Any]) -> str | None:
        """The agent LangGraph's Functional API names for a call made inside run `run_id` (with
        the task's `metadata`): the `@task` it runs in right under an `@entrypoint` (`researcher`
        of `workflow/researcher`, also from a graph the task invokes); None elsewhere (a graph's
        node, the entrypoint's own code, a run the tracker did not see)."""
        tasks = task_path(metadata)
        if len(tasks) < 2:
            return None
        with self._lock:
            run = self._runs.get(run_id) if run_id is not None else None
            inv = self._invocations.get(run.root) if run is not None else None
            if inv is None or inv.entry_task(tasks) is None:
                return None
        return node_path(metadata)[1]

    def launched(self, config: Mapping[str, Any]) -> tuple[UUID, str, int] | None:
        """A `@task` is being launched by the code running with `config` (its caller's): note
        when (probe/task_launches.py); what `unlaunched` takes back, None if not tracked."""
        caller = (config.get("configurable") or {}).get("checkpoint_ns")
        run_id = getattr(config.get("callbacks"), "parent_run_id", None)
        with self._lock:
            run = self._runs.get(run_id) if run_id is not None else None
            inv = self._invocations.get(run.root) if run is not None else None
            if inv is None or not isinstance(caller, str) or not caller:
                return None
            tick = inv.tick()
            inv.launches.setdefault(caller, []).append(tick)
            return run.root, caller, tick

    def unlaunched(self, launch: tuple[UUID, str, int]) -> None:
        root, caller, tick = launch
        with self._lock:
            inv = self._invocations.get(root)
            if inv is not None and tick in (ticks := inv.launches.get(caller, [])):
                ticks.remove(tick)

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
            previous = inv.previous(place)
            turn = None
            if agent_id is not None and (task := inv.entry_task(tasks)) is not None:
                turn = inv.task_turn(agent_id, task)
            elif agent_id is not None and step is not None:
                steps = inv.agent_steps.setdefault(agent_id, set())
                steps.add(step)
                turn = len(steps)
            inv.calls.append(PlacedCall(place, agent_id))
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
        if parent is None:  # an invocation starts: its @tasks' launches are to be seen
            task_launches.install(_SLOT.get)
        with self._lock:
            up = self._runs.get(parent) if parent is not None else None
            root = up.root if up is not None else run_id
            self._runs[run_id] = _Run(
                parent, root, md, tool, time.time_ns() if tool else 0, tool_input
            )
            if parent is None:
                self._invocations[run_id] = Invocation()
            inv = self._invocations.get(root)
            ns = md.get(NS_KEY)
            if inv is not None and isinstance(ns, str) and ns and "langgraph_step" in md:
                inv.task_steps.setdefault(ns, md["langgraph_step"])  # a node (any level) starts
                own = up is None or up.metadata.get(NS_KEY) != ns  # not a run inside it
                if own:
                    inv.launches.pop(ns, None)  # (a retried caller launches its tasks again)
                if own and is_call_task(md):
                    caller, index = ns.rpartition(NS_SEP)[0], md["langgraph_path"][2]
                    inv.task_started(run_id, ns, caller, index)
                triggers = md.get("langgraph_triggers")
                if NS_SEP not in ns and isinstance(triggers, tuple) and triggers == (START,):
                    inv.entrypoints.add(ns)  # the root graph's one node, run on its input

    def _end(
        self,
        run_id: UUID,
        tool_error: str | None = None,
        output: str | None = None,
        error: BaseException | None = None,
    ) -> None:
        failed: InvocationError | None = None
        end_ns = time.time_ns()
        with self._lock:
            run = self._runs.pop(run_id, None)
            if run is None:
                return
            inv = self._invocations.get(run.root)
            if inv is not None:
                inv.run_ended(run_id)
            if run.parent is None:
                self._invocations.pop(run_id, None)
                if inv is not None and inv.calls and error is not None and _fails(error):
                    failed = InvocationError(
                        str(run_id), type(error).__name__, error_text(error), end_ns
                    )
                inv = None
            if run.tool_name is not None and inv is not None:
                task = outer_task(run.metadata)
                inv.tool_ms[task] = inv.tool_ms.get(task, 0.0) + (end_ns - run.start_ns) / 1e6
        if failed is not None and self.on_error is not None:
            self.on_error(failed)
        if run.tool_name is not None and self.on_tool is not None:
            path = node_path(run.metadata)
            workflow = str(run.root) if inv is not None else None
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


def _fails(error: BaseException) -> bool:
    """Whether an exception ending a root run is a failure: not LangGraph's interrupt or
    hand-off signal (matched by name, so that langgraph need not be imported here)."""
    return not any(cls.__name__ in _BUBBLE_UP for cls in type(error).__mro__)


class _Slot:
    """The active tracker, process-wide. langchain-core's configure hook only calls `.get()`."""

    def __init__(self) -> None:
        self.tracker: RunTracker | None = None
        self.users = 0
        self.lock = threading.Lock()

    def get(self) -> RunTracker | None:
        return self.tracker


_SLOT = _Slot()
if register_configure_hook is not None:  # else no LangChain run to track
    register_configure_hook(cast(Any, _SLOT), inheritable=True)


def activate(
    on_tool: Callable[[ToolCall], None] | None = None,
    on_error: Callable[[InvocationError], None] | None = None,
) -> RunTracker:
    """Attach the process's tracker to every LangChain run from now on (re-entrant: each
    activate() needs its deactivate(); the first one's `on_tool` and `on_error` are kept)."""
    with _SLOT.lock:
        if _SLOT.tracker is None:
            _SLOT.tracker = RunTracker(on_tool, on_error)
            task_launches.install(_SLOT.get)
        _SLOT.users += 1
        return _SLOT.tracker


def deactivate() -> None:
    with _SLOT.lock:
        _SLOT.users = max(_SLOT.users - 1, 0)
        if _SLOT.users == 0:
            _SLOT.tracker = None
            task_launches.uninstall()


def active() -> RunTracker | None:
    return _SLOT.get()


def raised(workflow_run_id: str, error: BaseException, end_ns: int | None = None) -> None:
    """Another framework's run that made calls (probe/openai_agents.py, crewai.py, autogen.py;
    LangGraph's the tracker sees itself) ended with `error`: an invocation that raised, handed
    to the active tracker's `on_error` (its trace's root is then ERROR); none active: dropped."""
    tracker = active()
    if tracker is not None and tracker.on_error is not None:
        end_ns = time.time_ns() if end_ns is None else end_ns
        name = type(error).__name__
        tracker.on_error(InvocationError(workflow_run_id, name, error_text(error), end_ns))
