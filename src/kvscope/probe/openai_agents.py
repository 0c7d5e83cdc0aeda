"""Who is calling in an OpenAI Agents SDK app (`openai-agents`): the running agent, its run.

The SDK keeps its own run context in two context variables (`agents.tracing.scope.Scope`): the
current trace (one per `Runner.run` / `run_sync` / `run_streamed`, or the app's own
`with trace(...)` block around several runs) and the current span: an agent span
(`AgentSpanData`, named `Agent.name`) for each visit of an agent, inside it the function-tool
spans and, while the model request leaves, the generation (chat completions) or response span.
They hold whether or not tracing is enabled: with `set_tracing_disabled(True)`,
`OPENAI_AGENTS_DISABLE_TRACING` or `RunConfig(tracing_disabled=True)` the SDK makes no-op traces
and spans, which carry the same span data but no ids and reach no trace processor. So kvscope
does not register a trace processor (`add_trace_processor`, which the no-op spans never reach),
and the current span alone does not name the agent (it is the generation span, and a no-op one
has no parent id): `install()` wraps `Scope.set_current_span` / `reset_current_span` /
`reset_current_trace` to keep, in a context variable of its own, the chain of spans current in
this context (each one's enclosing spans), and the start of each, for function-tool time.

The rules (`place()`, called by probe/identity.py as a request leaves, when LangGraph does not
name the call):
- agent_id: the `name` of the innermost agent span around the call.
- graph_node: the agent names of the agent spans around the call, outermost first, `/`-joined:
  the agent itself, `outer/inner` for an agent run as another's tool (`Agent.as_tool`).
- workflow_run_id: the SDK's trace: its trace_id (`trace_...`) when tracing is on, else an id
  kvscope gives the run's no-op trace; one per `Runner.run`, or per `with trace(...)` block.
- thread_id: the trace's `group_id` (`RunConfig(group_id=...)`), None when none was given or
  tracing is disabled (a no-op trace does not keep it).
- turn_id: the k-th visit of the agent in the workflow that made calls (a hand-off back to an
  earlier agent is its next turn; the calls of one visit, its tool loop, share it).
- previous_agent_id: the agent of the workflow's previous call (the agent that handed off, for
  the first call after a hand-off); None for the first.
- tool_ms: time in function tools run under the agent since its previous call (None: none ran).
  Function tools run in a function span whether or not tracing is on (a no-op one when off).
Each function tool run is also a ToolCall (tools.jsonl) through the active tracker's `on_tool`;
its `error` is the SDK's span error message ("Error running tool", ...: the span does not keep
the exception's type), None where the tool did not fail or tracing is disabled (a no-op span
keeps no error).

Nothing here imports `agents`: `watch()` installs when `agents.tracing.scope` is imported (a
post-import hook on `sys.meta_path`), or at once if it is already.
"""

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kvscope.probe import post_import, run_tracker
from kvscope.probe.place import FrameworkPlace
from kvscope.records.tools import ToolCall, tool_text

log = logging.getLogger(__name__)
SCOPE_MODULE = "agents.tracing.scope"
# where a run's trace ends with the exception that ended it (`Runner.run`'s TraceCtxManager, the
# app's own `with trace(...)` block): module -> the classes whose __exit__ is wrapped
EXITS = {"agents.tracing.context": ("TraceCtxManager",),
         "agents.tracing.traces": ("TraceImpl", "NoOpTrace", "ReattachedTrace")}  # fmt: skip
NO_OP = "no-op"  # the SDK's trace and span id of a no-op (disabled) trace or span
MAX_RUNS = 4096  # runs kept at once (each is dropped when its trace ends)


AgentsPlace = FrameworkPlace  # an Agents SDK call's identity columns


@dataclass(frozen=True)
class _Entry:
    span: Any
    start_ns: int


@dataclass
class _Run:
    """One SDK trace (workflow) while it is current somewhere."""

    trace: Any
    workflow_run_id: str
    thread_id: str | None
    last_agent: str | None = None
    visits: dict[str, list[Any]] = field(default_factory=dict)  # agent -> its spans with calls
    tool_ms: dict[str, float] = field(default_factory=dict)  # agent -> tool time not charged


_CHAIN: ContextVar[tuple[_Entry, ...]] = ContextVar("kvscope_agents_spans", default=())
_LOCK = threading.Lock()
_RUNS: dict[int, _Run] = {}  # id(trace) -> its run
_SCOPE: list[type] = []  # the wrapped Scope class, once installed
_WATCHING: list[bool] = []  # watch() asked for the install


def watch() -> None:
    """Install now if the SDK is imported, else as soon as it is (idempotent, cheap)."""
    if _SCOPE or _WATCHING:
        return
    _WATCHING.append(True)
    post_import.when_imported(SCOPE_MODULE, install)
    for name in EXITS:
        post_import.when_imported(name, _wrap_exits)


def install(module: ModuleType) -> bool:
    """Wrap `module.Scope`'s span and trace setters (idempotent); False where the SDK's Scope
    is not the one this was written for (then no call is named by it)."""
    with _LOCK:
        if _SCOPE:
            return True
        scope = getattr(module, "Scope", None)
        names = ("set_current_span", "reset_current_span", "get_current_span",
                 "get_current_trace", "reset_current_trace")  # fmt: skip
        if not isinstance(scope, type) or not all(hasattr(scope, n) for n in names):
            log.warning("kvscope: openai-agents' Scope is not as expected: agents not named")
            return False
        _wrap(scope)
        _SCOPE.append(scope)
        return True


def place() -> AgentsPlace | None:
    """Register a model call made now and say where it sits; None outside an SDK agent (or
    before the SDK was imported)."""
    if not _SCOPE:
        return None
    scope = _SCOPE[0]
    trace = scope.get_current_trace()
    chain = _chain(scope.get_current_span())
    agents = [e.span for e in chain if _kind(e.span) == "agent"]
    if trace is None or not agents:
        return None
    names = [str(getattr(s.span_data, "name", None) or "agent") for s in agents]
    agent, span = names[-1], agents[-1]
    with _LOCK:
        run = _run(trace)
        spans = run.visits.setdefault(agent, [])
        if not any(s is span for s in spans):
            spans.append(span)
        turn = 1 + next(i for i, s in enumerate(spans) if s is span)
        previous, run.last_agent = run.last_agent, agent
        tool_ms = run.tool_ms.pop(agent, None)
    return AgentsPlace(agent, "/".join(names), run.workflow_run_id, run.thread_id, turn,
                       previous, tool_ms)  # fmt: skip


def _kind(span: Any) -> str | None:
    """The span's data type (`agent`, `function`, `generation`, ...; SpanData.type)."""
    return getattr(getattr(span, "span_data", None), "type", None)


def _chain(current: Any) -> tuple[_Entry, ...]:
    """The spans current in this context, outermost first, ending at `current` (the chain this
    module kept, cut back to it: the SDK resets its variable with tokens, this one lags)."""
    if current is None:
        return ()
    chain = _CHAIN.get()
    for i in range(len(chain) - 1, -1, -1):
        if chain[i].span is current:
            return chain[: i + 1]
    return (_Entry(current, time.time_ns()),)  # set before install: its enclosing spans unknown


def _run(trace: Any) -> _Run:
    """The run of `trace` (under _LOCK), made on its first call."""
    run = _RUNS.get(id(trace))
    if run is None or run.trace is not trace:
        real = getattr(trace, "trace_id", NO_OP) != NO_OP
        workflow = str(trace.trace_id) if real else f"agents_{uuid.uuid4().hex}"
        group = getattr(trace, "group_id", None) if real else None
        run = _RUNS[id(trace)] = _Run(trace, workflow, None if group is None else str(group))
        while len(_RUNS) > MAX_RUNS:
            del _RUNS[next(iter(_RUNS))]
    return run


def _wrap(scope: type) -> None:
    set_span, reset_span = scope.set_current_span, scope.reset_current_span
    reset_trace = scope.reset_current_trace

    def set_current_span(cls: type, span: Any) -> Any:
        try:
            chain = _chain(cls.get_current_span())
            _CHAIN.set((*chain, _Entry(span, time.time_ns())) if span is not None else ())
        except Exception:  # never the app's failure
            log.debug("kvscope: could not follow an Agents SDK span", exc_info=True)
        return set_span(span)

    def reset_current_span(cls: type, token: Any) -> Any:
        ending = cls.get_current_span()
        chain = _chain(ending) if _kind(ending) == "function" else ()
        result = reset_span(token)
        if chain:
            try:
                _tool_ended(chain, time.time_ns())
            except Exception:
                log.debug("kvscope: could not time an Agents SDK tool", exc_info=True)
        return result

    def reset_current_trace(cls: type, token: Any) -> Any:
        ending = cls.get_current_trace()
        result = reset_trace(token)
        with _LOCK:
            run = _RUNS.get(id(ending))
            if run is not None and run.trace is ending and cls.get_current_trace() is not ending:
                del _RUNS[id(ending)]
        return result

    for name, fn in (("set_current_span", set_current_span),
                     ("reset_current_span", reset_current_span),
                     ("reset_current_trace", reset_current_trace)):  # fmt: skip
        setattr(scope, name, classmethod(fn))


def _tool_ended(chain: Sequence[_Entry], end_ns: int) -> None:
    """A function tool's span (the chain's last) ended: its time to its agent, its row out."""
    entry, data = chain[-1], chain[-1].span.span_data
    agents = [str(getattr(e.span.span_data, "name", "agent")) for e in chain if
              _kind(e.span) == "agent"]  # fmt: skip
    trace = _SCOPE[0].get_current_trace()
    workflow = None
    if agents and trace is not None:
        with _LOCK:
            run = _run(trace)
            ms = (end_ns - entry.start_ns) / 1e6
            run.tool_ms[agents[-1]] = run.tool_ms.get(agents[-1], 0.0) + ms
            workflow = run.workflow_run_id
    tracker = run_tracker.active()
    on_tool: Callable[[ToolCall], None] | None = getattr(tracker, "on_tool", None)
    if on_tool is None:
        return
    error = getattr(entry.span, "error", None)  # the SDK's SpanError (None on a no-op span)
    error = error.get("message") if isinstance(error, dict) else None
    on_tool(ToolCall(str(getattr(data, "name", "tool")), workflow, "/".join(agents) or None,
                     entry.start_ns, end_ns, None if error is None else str(error),
                     tool_text(getattr(data, "input", None)),
                     tool_text(getattr(data, "output", None))))  # fmt: skip


def _wrap_exits(module: ModuleType) -> None:
    """Wrap the __exit__ of `module`'s classes in EXITS (each once): a run or trace block that
    ends with an exception, in a workflow that made calls, is an invocation that raised
    (records/invocations.py: its trace's root span then has status ERROR)."""
    for name in EXITS.get(module.__name__, ()):
        cls = getattr(module, name, None)
        exit_ = getattr(cls, "__dict__", {}).get("__exit__")
        if exit_ is None:
            log.warning("kvscope: openai-agents' %s is not as expected: a run that raises is "
                        "not marked in its trace", name)  # fmt: skip
        elif not getattr(exit_, "__kvscope__", False):
            marking = _exit_marking(exit_, is_trace=name != "TraceCtxManager")
            cls.__exit__ = marking  # type: ignore[union-attr]


def _exit_marking(exit_: Callable[..., Any], is_trace: bool) -> Callable[..., Any]:
    """`exit_` that first hands an exception ending the trace to `_raised` (the trace: the
    object itself, or a run's TraceCtxManager's `trace`, None where an outer trace was current)."""

    def __exit__(self: Any, exc_type: Any, exc: Any, tb: Any) -> Any:
        if exc is not None and exc_type is not GeneratorExit:
            try:
                _raised(self if is_trace else getattr(self, "trace", None), exc)
            except Exception:  # never the app's failure
                log.debug("kvscope: could not mark an Agents SDK run that raised", exc_info=True)
        return exit_(self, exc_type, exc, tb)

    __exit__.__kvscope__ = True  # type: ignore[attr-defined]
    return __exit__


def _raised(trace: Any, error: BaseException) -> None:
    """`trace` (a run's, or the app's block's) ended with `error`: an invocation that raised,
    where its workflow made calls (none: it has no rows, so no trace)."""
    with _LOCK:
        run = _RUNS.get(id(trace))
        workflow = run.workflow_run_id if run is not None and run.trace is trace else None
    if workflow is not None:
        run_tracker.raised(workflow, error)
