"""Who is calling in an AutoGen app (`autogen-agentchat` 0.7): the speaking agent, its team run.

AgentChat runs a team's agents in an agent runtime (an embedded `SingleThreadedAgentRuntime` per
team unless the app gives one): `BaseGroupChat.run_stream` sends the group chat manager a start
message and each participant speaks in a message handler of its `ChatAgentContainer`, a task of
the runtime's own, which calls the agent's `on_messages_stream`; the model client posts from a
task that call creates (`asyncio.ensure_future`), so it sees the context variables of the
handler. The runtime keeps the handling agent's `AgentId` in a context variable of its own
(`autogen_core.MessageHandlerContext.agent_id()`), and every agent of a team is keyed by the
team's id (`AgentId.key == team._team_id`, one team object runs once at a time). AgentChat has
no run id, conversation id or run event to read; so kvscope wraps, as their modules are first
imported, the narrowest methods that bound a run and a speaker:
- `BaseGroupChat.run_stream` (`run` goes through it): a team run, registered by its team id
  while it runs;
- `BaseChatAgent.run` / `run_stream`: a single agent's run outside a team;
- `on_messages` / `on_messages_stream` of `BaseChatAgent` and of every subclass defining its own
  (`AssistantAgent`, ..., the app's own agents: through `BaseChatAgent.__init_subclass__`): an
  agent speaking, kept in a context variable of this module for each step of the agent's stream
  only (the variable is reset before each item is handed to the caller);
- `SelectorGroupChatManager.select_speaker`: the team's own model call choosing the speaker;
- `autogen_core.tools.BaseTool.run_json`: a tool run, timed for its agent.

The rules (`place()`, called by probe/identity.py as a request leaves, when LangGraph does not
name the call):
- agent_id: the `name` of the AgentChat agent whose `on_messages` / `on_messages_stream` is
  running (the innermost); a SelectorGroupChat's speaker-selection call is the team's manager,
  named as AutoGen names it: `SelectorGroupChatManager`.
- graph_node: the names around the agent, outermost first, `/`-joined: `team/agent` (the team's
  `name`, `RoundRobinGroupChat` etc. by default), the agent's name alone in a single agent's
  run; a team run inside another team (a participant, or a SocietyOfMindAgent's inner team)
  adds its name under the enclosing team or agent: `outer/inner/agent`.
- workflow_run_id: an id kvscope gives each `team.run` / `run_stream` call (`autogen_<hex>`),
  and each `agent.run` / `run_stream` outside a team (a direct `on_messages` call outside any
  run is a run of its own); a team or agent run inside another run (a nested team, an
  `AgentTool` / `TeamTool`) is part of the enclosing run.
- thread_id: None (AgentChat keeps no conversation id).
- turn_id: the k-th time the agent spoke in the run and made calls (an `on_messages(_stream)`
  call of it, counted at its first model call; the calls of one speaking turn, its tool loop and
  reflection, share it).
- previous_agent_id: the agent of the run's previous call; None for the first.
- tool_ms: time in AutoGen tools (`BaseTool.run_json`) run while the agent spoke since its
  previous call, summed; None where none ran.

Standard library only: nothing here imports autogen (`watch()` installs as each module is first
executed, a post-import hook on `sys.meta_path`, or at once where it already is), and the module
runs in the app's interpreter, where kvscope's own dependencies may not be installed.
"""

import functools
import inspect
import logging
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from kvscope.probe import post_import
from kvscope.probe.place import FrameworkPlace

log = logging.getLogger(__name__)
AGENT_MODULE = "autogen_agentchat.agents._base_chat_agent"
TEAM_MODULE = "autogen_agentchat.teams._group_chat._base_group_chat"
SELECTOR_MODULE = "autogen_agentchat.teams._group_chat._selector_group_chat"
TOOL_MODULE = "autogen_core.tools._base"
HANDLER_MODULE = "autogen_core._message_handler_context"
MARK = "__kvscope_autogen__"  # set on each wrapper: a method is wrapped once


@dataclass
class _Run:
    """One workflow: a team's (or a single agent's) run."""

    workflow_run_id: str
    last_agent: str | None = None
    turns: dict[str, int] = field(default_factory=dict)  # agent -> its turns with calls so far
    tool_ms: dict[str, float] = field(default_factory=dict)  # agent -> tool time not charged


@dataclass(eq=False)
class _Frame:
    """Where code runs: a run (agent None) or an agent speaking in it."""

    run: _Run
    path: tuple[str, ...]  # the names around the agent: the teams (and agents) enclosing it
    handler: Any = None  # the runtime's handling AgentId where the frame was made
    agent: str | None = None
    owner: int = 0  # id() of the speaking agent object
    turn: int = 0  # 0 until the turn's first call


_WHERE: ContextVar["_Frame | None"] = ContextVar("kvscope_autogen_where", default=None)
_TIMING: ContextVar["_Frame | None"] = ContextVar("kvscope_autogen_tool", default=None)
_LOCK = threading.Lock()
_TEAMS: dict[str, _Frame] = {}  # team id -> the frame of its run, while it runs
_DONE: set[str] = set()  # modules installed
_WATCHING: list[bool] = []  # watch() asked for the installs


def watch() -> None:
    """Install on each AutoGen module already imported, and on the others as soon as they are
    (idempotent, cheap)."""
    if _WATCHING:
        return
    _WATCHING.append(True)
    for name in _INSTALLERS:
        post_import.when_imported(name, functools.partial(install, name))


def install(name: str, module: ModuleType) -> bool:
    """Wrap what `module` (one of the modules named above) defines (idempotent); False where it
    is not as expected (then its part of the rules names nothing)."""
    with _LOCK:
        if name in _DONE:
            return True
        _DONE.add(name)
    try:
        _INSTALLERS[name](module)
        return True
    except Exception:  # never the app's failure
        log.warning("kvscope: AutoGen's %s is not as expected: its agents not named", name,
                    exc_info=True)  # fmt: skip
        return False


def place() -> FrameworkPlace | None:
    """Register a model call made now and say where it sits; None outside an AutoGen agent."""
    frame = _WHERE.get()
    if frame is None or frame.agent is None:
        return None
    run, agent = frame.run, frame.agent
    with _LOCK:
        if not frame.turn:
            frame.turn = run.turns[agent] = run.turns.get(agent, 0) + 1
        previous, run.last_agent = run.last_agent, agent
        tool_ms = run.tool_ms.pop(agent, None)
    return FrameworkPlace(agent, "/".join((*frame.path, agent)), run.workflow_run_id, None,
                          frame.turn, previous, tool_ms)  # fmt: skip


def _new_run() -> _Run:
    return _Run(f"autogen_{uuid.uuid4().hex}")


def _handler() -> Any:
    """The AgentId whose message handler runs here (autogen_core's own context), else None."""
    module = sys.modules.get(HANDLER_MODULE)
    if module is None:
        return None
    try:
        return module.MessageHandlerContext.agent_id()
    except Exception:  # outside a handler
        return None


def _enclosing() -> _Frame | None:
    """The run (or speaking agent) around code starting now: this module's frame where it was
    made in the same message handler, else the team whose handler this is, else the frame."""
    frame, handler = _WHERE.get(), _handler()
    if frame is not None and frame.handler == handler:
        return frame
    team = _TEAMS.get(str(getattr(handler, "key", ""))) if handler is not None else None
    return team or frame


def _inside(enclosing: _Frame | None) -> tuple[_Run, tuple[str, ...]]:
    """The run and the names that a run or agent starting under `enclosing` goes in."""
    if enclosing is None:
        return _new_run(), ()
    extra = (enclosing.agent,) if enclosing.agent is not None else ()
    return enclosing.run, (*enclosing.path, *extra)


def _speaker(name: str, owner: object) -> _Frame:
    """The frame of `owner` (named `name`) speaking now: the current one where it is already
    speaking (`on_messages` going through its own `on_messages_stream`), else a new turn."""
    enclosing = _enclosing()
    if enclosing is not None and enclosing.owner == id(owner) and enclosing.agent == name:
        return enclosing
    run, path = _inside(enclosing)
    return _Frame(run, path, _handler(), name, id(owner))


def _agent_frame(agent: Any) -> _Frame:
    return _speaker(str(getattr(agent, "name", None) or type(agent).__name__), agent)


def _run_frame(_: Any) -> _Frame:
    """A single agent's run: inside the enclosing run, else a workflow of its own."""
    run, path = _inside(_enclosing())
    return _Frame(run, path, _handler())


def _manager_frame(manager: Any) -> _Frame:
    return _speaker(str(getattr(manager, "_name", None) or "selector"), manager)


def _framed(framing: Callable[[Any], _Frame], owner: Any) -> _Frame | None:
    try:
        return framing(owner)
    except Exception:  # never the app's failure
        log.debug("kvscope: could not place an AutoGen step", exc_info=True)
        return None


async def _relay(frame: _Frame | None, stream: Any) -> AsyncIterator[Any]:
    """`stream`'s items, each step run with `frame` current (not while the caller has the item:
    the variable is set in the consumer's context, an async generator's steps run there)."""
    try:
        while True:
            token = None if frame is None else _WHERE.set(frame)
            try:
                item = await stream.__anext__()
            except StopAsyncIteration:
                return
            finally:
                if token is not None:
                    _WHERE.reset(token)
            yield item
    finally:
        await stream.aclose()


def _wrapped(
    fn: Callable[..., Any], framing: Callable[[Any], _Frame], run: bool = False
) -> Callable[..., Any]:
    """`fn` (a method: a coroutine or async generator function) run in the frame `framing`
    gives for its object; `run`: a run's method (an exception ending a workflow it began is
    an invocation that raised: `_ended`)."""
    if getattr(fn, MARK, False):
        return fn
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def stream(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            frame = _framed(framing, self)
            relay = _relay(frame, fn(self, *args, **kwargs))
            try:
                async for item in relay:
                    yield item
            except BaseException as err:
                _ended(frame if run else None, err, top=())
                raise
            finally:
                await relay.aclose()

        setattr(stream, MARK, True)
        return stream

    @functools.wraps(fn)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = _framed(framing, self)
        token = None if frame is None else _WHERE.set(frame)
        try:
            return await fn(self, *args, **kwargs)
        except BaseException as err:
            _ended(frame if run else None, err, top=())
            raise
        finally:
            if token is not None:
                _WHERE.reset(token)

    setattr(call, MARK, True)
    return call


def _ended(frame: _Frame | None, error: BaseException, top: tuple[str, ...]) -> None:
    """A run's method raised: where the run began its workflow (its frame's path is `top`: no
    enclosing run) and made calls, an invocation that raised (run_tracker.raised). Not the app
    closing a stream early (GeneratorExit)."""
    if frame is None or frame.path != top or isinstance(error, GeneratorExit):
        return
    if frame.run.last_agent is None:  # no call: no rows, no trace
        return
    from kvscope.probe import run_tracker  # only where a run raised

    try:
        run_tracker.raised(frame.run.workflow_run_id, error)
    except Exception:  # never the app's failure
        log.debug("kvscope: could not mark an AutoGen run that raised", exc_info=True)


def _wrap_agent_class(cls: type) -> None:
    """Wrap the speaking methods `cls` defines itself."""
    for name in ("on_messages", "on_messages_stream"):
        fn = cls.__dict__.get(name)
        if callable(fn) and not getattr(fn, "__isabstractmethod__", False):
            setattr(cls, name, _wrapped(fn, _agent_frame))


def _install_agents(module: ModuleType) -> None:
    base: type = module.BaseChatAgent
    for name in ("run", "run_stream"):
        setattr(base, name, _wrapped(base.__dict__[name], _run_frame, run=True))
    _wrap_agent_class(base)
    pending, seen = list(base.__subclasses__()), set()
    while pending:  # subclasses defined before install
        sub = pending.pop()
        if sub not in seen:
            seen.add(sub)
            _wrap_agent_class(sub)
            pending.extend(sub.__subclasses__())
    own = base.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if own is not None:
            own.__func__(cls, **kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        try:
            _wrap_agent_class(cls)
        except Exception:
            log.debug("kvscope: could not wrap AutoGen agent %s", cls, exc_info=True)

    base.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]


def _install_teams(module: ModuleType) -> None:
    base: type = module.BaseGroupChat
    run_stream = base.__dict__["run_stream"]
    if getattr(run_stream, MARK, False):
        return

    @functools.wraps(run_stream)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        key = str(getattr(self, "_team_id", ""))
        stream = run_stream(self, *args, **kwargs)
        frame = None
        if key and not getattr(self, "_is_running", False):  # else AutoGen refuses the run
            frame = _framed(_team_frame, self)
        if frame is not None:
            with _LOCK:
                _TEAMS[key] = frame
        try:
            async for item in stream:
                yield item
        except BaseException as err:
            _ended(frame, err, top=frame.path[-1:] if frame is not None else ())
            raise
        finally:
            if frame is not None:
                with _LOCK:
                    if _TEAMS.get(key) is frame:
                        del _TEAMS[key]
            await stream.aclose()

    setattr(wrapper, MARK, True)
    base.run_stream = wrapper


def _team_frame(team: Any) -> _Frame:
    """A team's run: inside the enclosing run, else a workflow of its own."""
    run, path = _inside(_enclosing())
    return _Frame(run, (*path, str(getattr(team, "name", None) or type(team).__name__)))


def _install_selector(module: ModuleType) -> None:
    manager: type = module.SelectorGroupChatManager
    manager.select_speaker = _wrapped(manager.__dict__["select_speaker"], _manager_frame)


def _install_tools(module: ModuleType) -> None:
    base: type = module.BaseTool
    run_json = base.__dict__["run_json"]
    if getattr(run_json, MARK, False):
        return

    @functools.wraps(run_json)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        frame = _WHERE.get()
        if frame is None or frame.agent is None or _TIMING.get() is frame:
            return await run_json(self, *args, **kwargs)
        token, start = _TIMING.set(frame), time.perf_counter_ns()
        try:
            return await run_json(self, *args, **kwargs)
        finally:
            ms = (time.perf_counter_ns() - start) / 1e6
            _TIMING.reset(token)
            with _LOCK:
                spent = frame.run.tool_ms
                spent[frame.agent] = spent.get(frame.agent, 0.0) + ms

    setattr(wrapper, MARK, True)
    base.run_json = wrapper


_INSTALLERS: dict[str, Callable[[ModuleType], None]] = {
    AGENT_MODULE: _install_agents,
    TEAM_MODULE: _install_teams,
    SELECTOR_MODULE: _install_selector,
    TOOL_MODULE: _install_tools,
}
