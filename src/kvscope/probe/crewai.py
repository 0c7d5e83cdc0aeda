"""Who is calling in a CrewAI app (`crewai`): the running agent, its task, its crew kickoff.

CrewAI announces where its run is on its own event bus (`crewai.events.event_bus`, the singleton
`crewai_event_bus`): every kickoff, task, agent execution, LLM call and tool use emits a
started and a completed (or failed / error) event, from the code doing the work, in its thread
and context. Handlers registered on the bus run later, in the bus's thread pool, so a handler
cannot tell which context the work runs in; `install()` instead wraps the bus's own
`CrewAIEventsBus.emit` / `aemit` to see each event as it is emitted, in the emitting context,
and keeps, in a context variable of its own, the chain of kickoffs, agent executions and tool
uses open there (pushed on a started event, cut back to before the innermost open one of the
same kind on its completed / failed / error event). CrewAI copies the context into the threads
and tasks it runs work in (the agent executor's event loop thread, `async_execution` tasks,
`kickoff_async`'s `asyncio.to_thread`, parallel tool calls), so the chain is the one of the
code that sends the request; two kickoffs at once (threads or asyncio) each keep their own.

The rules (`place()`, called by probe/identity.py as a request leaves, when LangGraph does not
name the call):
- agent_id: the `role` of the innermost agent execution open around the call
  (`AgentExecutionStartedEvent.agent`): the agent running its task, the coworker a hierarchical
  crew's manager delegated to (inside the manager's delegation tool), the manager itself
  (`Crew Manager`, or the role of the crew's `manager_agent`) while it plans and delegates.
- graph_node: `role/task`, the task being the task's `name`, else its description (whitespace
  collapsed, cut to 60 characters): the task the crew gave the agent, or the task a delegation
  made for the coworker (its description is the manager's words).
- workflow_run_id: the crew kickoff around that agent: the `event_id` of its
  `CrewKickoffStartedEvent` (CrewAI's own id of that execution, kept as `Crew._kickoff_event_id`);
  one per `Crew.kickoff` / `kickoff_async` / `akickoff` and per input of `kickoff_for_each`.
- thread_id: None (a crew kickoff has no conversation or session id of CrewAI's).
- turn_id: the k-th agent execution (task, or delegated task) of the agent in the kickoff that
  made calls; the calls of one execution, its tool loop, share it.
- previous_agent_id: the agent of the kickoff's previous call; None for the first.
- tool_ms: time in CrewAI tools (`ToolUsageStartedEvent` to its finished / error event) used by
  the agent since its previous call; None where none ran. A manager's delegation is a tool: its
  time includes the coworker's work, calls and all.
A call outside a crew kickoff (`Agent.kickoff` / `LiteAgent` on their own, an LLM called
directly) or outside an agent execution in it is not placed (None); so is a call of a kickoff
resumed from a checkpoint (`from_checkpoint`: CrewAI emits no new kickoff started event).

Standard library only (and kvscope.probe.place): this runs in the app's interpreter, also where
kvscope's dependencies are not installed. Nothing here imports `crewai`: `watch()` installs when
`crewai.events.event_bus` is imported (a post-import hook on `sys.meta_path`), or at once if it
is already.
"""

import logging
import sys
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kvscope.probe import post_import
from kvscope.probe.place import FrameworkPlace

log = logging.getLogger(__name__)
BUS_MODULE = "crewai.events.event_bus"
BUS_CLASS = "CrewAIEventsBus"
TASK_CHARS = 60  # a task without a name is named by its description, cut to this

CrewAIPlace = FrameworkPlace  # a CrewAI call's identity columns

# event type -> (frame kind, True: opens it / False: closes it)
_EVENTS: dict[str, tuple[str, bool]] = {
    "crew_kickoff_started": ("crew", True),
    "crew_kickoff_completed": ("crew", False),
    "crew_kickoff_failed": ("crew", False),
    "agent_execution_started": ("agent", True),
    "agent_execution_completed": ("agent", False),
    "agent_execution_error": ("agent", False),
    "tool_usage_started": ("tool", True),
    "tool_usage_finished": ("tool", False),
    "tool_usage_error": ("tool", False),
}


@dataclass
class _Run:
    """One crew kickoff; its state is shared by the contexts its work runs in (under _LOCK)."""

    workflow_run_id: str
    last_agent: str | None = None
    visits: dict[str, list[object]] = field(default_factory=dict)  # role -> executions w/ calls
    tool_ms: dict[str, float] = field(default_factory=dict)  # role -> tool time not charged


@dataclass(frozen=True, eq=False)
class _Frame:
    """A kickoff, agent execution or tool use open in this context."""

    kind: str  # "crew", "agent" or "tool"
    run: _Run | None = None  # crew frames
    agent: str | None = None  # agent frames: the role
    node: str | None = None  # agent frames: role/task
    start_ns: int = 0


_CHAIN: ContextVar[tuple[_Frame, ...]] = ContextVar("kvscope_crewai_chain", default=())
_LOCK = threading.Lock()
_BUS: list[type] = []  # the wrapped CrewAIEventsBus class, once installed
_WATCHING: list[bool] = []  # watch() asked for the install


def watch() -> None:
    """Install now if CrewAI's event bus is imported, else as soon as it is (idempotent, cheap)."""
    if _BUS or _WATCHING:
        return
    _WATCHING.append(True)
    post_import.when_imported(BUS_MODULE, install)


def install(module: ModuleType) -> bool:
    """Wrap `module.CrewAIEventsBus.emit` / `aemit` (idempotent); False where the bus is not the
    one this was written for (then no call is named by it)."""
    with _LOCK:
        if _BUS:
            return True
        bus = getattr(module, BUS_CLASS, None)
        if not isinstance(bus, type) or not callable(getattr(bus, "emit", None)):
            log.warning("kvscope: crewai's event bus is not as expected: agents not named")
            return False
        _wrap(bus)
        _BUS.append(bus)
        return True


def place() -> CrewAIPlace | None:
    """Register a model call made now and say where it sits; None outside a CrewAI agent
    execution in a crew kickoff (or before CrewAI was imported)."""
    chain = _CHAIN.get()
    if not chain:
        return None
    crew = _innermost(chain, "crew")
    agent = _innermost(chain, "agent")
    if crew is None or agent is None or agent < crew:
        return None
    run, frame = chain[crew].run, chain[agent]
    if run is None or frame.agent is None:
        return None
    role = frame.agent
    with _LOCK:
        frames = run.visits.setdefault(role, [])
        if not any(f is frame for f in frames):
            frames.append(frame)
        turn = 1 + next(i for i, f in enumerate(frames) if f is frame)
        previous, run.last_agent = run.last_agent, role
        tool_ms = run.tool_ms.pop(role, None)
    return CrewAIPlace(role, frame.node, run.workflow_run_id, None, turn, previous, tool_ms)


def _innermost(chain: tuple[_Frame, ...], kind: str) -> int | None:
    """The index of the innermost frame of `kind` in `chain`, None where there is none."""
    for i in range(len(chain) - 1, -1, -1):
        if chain[i].kind == kind:
            return i
    return None


def _task_name(task: Any) -> str:
    """The task's `name`, else its description, whitespace collapsed, cut to TASK_CHARS."""
    name = getattr(task, "name", None)
    if name:
        return str(name)
    text = " ".join(str(getattr(task, "description", None) or "task").split())
    return text[:TASK_CHARS].rstrip()


def _seen(event: Any) -> None:
    """Follow one event as it is emitted (in the emitting context)."""
    kind, opens = _EVENTS.get(str(getattr(event, "type", "")), ("", False))
    if not kind:
        return
    chain = _CHAIN.get()
    now = time.time_ns()
    if opens:
        if kind == "crew":
            frame = _Frame("crew", run=_Run(str(event.event_id)), start_ns=now)
        elif kind == "agent":
            role = str(getattr(getattr(event, "agent", None), "role", None) or "agent")
            node = f"{role}/{_task_name(getattr(event, 'task', None))}"
            frame = _Frame("agent", agent=role, node=node, start_ns=now)
        else:
            frame = _Frame("tool", start_ns=now)
        _CHAIN.set((*chain, frame))
        return
    i = _innermost(chain, kind)
    if i is None:  # opened in a context this one does not see (or before install)
        return
    _CHAIN.set(chain[:i])
    if kind == "tool":
        _tool_ended(chain[: i + 1], now)
    elif event.type == "crew_kickoff_failed":
        _kickoff_failed(chain[i].run, str(getattr(event, "error", "") or ""), now)


def _tool_ended(chain: tuple[_Frame, ...], end_ns: int) -> None:
    """A tool use (the chain's last frame) ended: its time to the agent that used it."""
    crew, agent = _innermost(chain, "crew"), _innermost(chain, "agent")
    if crew is None or agent is None or agent < crew:
        return
    run, role = chain[crew].run, chain[agent].agent
    if run is None or role is None:
        return
    ms = (end_ns - chain[-1].start_ns) / 1e6
    with _LOCK:
        run.tool_ms[role] = run.tool_ms.get(role, 0.0) + ms


class KickoffFailed(RuntimeError):
    """A failed kickoff whose exception is not in reach here: only its text (the event's)."""


def _kickoff_failed(run: _Run | None, message: str, end_ns: int) -> None:
    """A kickoff that made calls raised: an invocation that raised (run_tracker.raised). CrewAI
    emits the failed event while it handles the exception: that is the one handled here."""
    if run is None or not run.visits:
        return
    from kvscope.probe import run_tracker  # only where a kickoff failed

    handled = sys.exc_info()[1] or KickoffFailed(message)  # CrewAI's event keeps only str(e)
    run_tracker.raised(run.workflow_run_id, handled, end_ns)


def _follow(event: Any) -> None:
    try:
        _seen(event)
    except Exception:  # never the app's failure
        log.debug("kvscope: could not follow a CrewAI event", exc_info=True)


def _wrap(bus: type) -> None:
    emit: Callable[..., Any] = bus.emit
    aemit: Callable[..., Any] | None = getattr(bus, "aemit", None)

    def emit_followed(self: Any, source: Any, event: Any) -> Any:
        _follow(event)
        return emit(self, source, event)

    bus.emit = emit_followed  # type: ignore[attr-defined]
    if aemit is not None:
        original_aemit = aemit

        async def aemit_followed(self: Any, source: Any, event: Any) -> Any:
            _follow(event)
            return await original_aemit(self, source, event)

        bus.aemit = aemit_followed  # type: ignore[attr-defined]
