"""Who is calling: the identity of an LLM call, read from LangGraph's run context as it is made.

`identify()` is called at the moment a request leaves (probe/intercept.py). It reads the running
LangGraph node's config (langchain-core's context variable, set while a node and anything it calls
run, in its thread or task) and the active RunTracker (probe/run_tracker.py). The rules:

- agent_id: `kvscope.agent(...)` if a block names one; else the top-level node's metadata
  `{"kvscope": {"agent": ...}}`; else, in LangGraph's Functional API, the `@task` the call runs
  in right under the `@entrypoint` (its name; the entrypoint is the workflow, and a call of the
  entrypoint's own code is the entrypoint's); else the top-level node: inside a subgraph or a
  prebuilt agent (`create_react_agent`, supervisor / swarm patterns) the outer node the app
  named, not its inner `agent` / `tools` node. Outside any graph and any `agent()` block: None
  (the call is still a row).
- graph_node: the full node path from the root graph, `outer/inner` (`research/agent`;
  `workflow/researcher` for an entrypoint's task).
- thread_id: the invocation's `configurable.thread_id` (None if the app gave none).
- workflow_run_id: the root run of the invocation (`graph.invoke(...)`, or the runnable the app
  invoked around it): one id per invocation, the same for every call in it, subgraphs included.
- step: the invocation's top-level superstep of the call (a subgraph's own steps do not count).
- turn_id: how many distinct top-level supersteps of this invocation the agent has made calls in,
  this one included, from 1: the k-th visit of the agent in the invocation, i.e. the loop
  iteration (the PEER cycle for PEER's agents). Calls of one visit (a react agent's inner loop, or
  Send branches of one node) share a turn. An entrypoint's task is one visit: its turn is 1 + the
  latest turn of the agent's tasks that ended before it was launched, so tasks launched together
  (futures gathered) share a turn, and a task called again after them is the next. Conversation
  turns are invocations: `thread_turn` numbers a thread's invocations, set at finalize over the
  whole run (finalize/thread_turns.py).
- previous_agent_id: the agent of the latest call that happened before this one in the same
  invocation: at the first graph level where the two calls' tasks differ, one made at an earlier
  superstep of that level, or, for two `@task`s, in a task that ended before this one was launched;
  or one earlier in the same task. Parallel branches (a `Send` fan-out, in the root graph or
  inside a subgraph; `@task`s launched together) do not see each other, so each branch's
  previous agent is the dispatcher; a react agent's second call follows its own first (a return
  to itself). None for an invocation's first call, and outside a graph. `@task`s are ordered by
  when their caller launched them (probe/task_launches.py), not when they started: one waiting
  for a free worker is still parallel to its siblings; one launched after a sibling had ended
  follows it, whether or not the caller waited for it.
- tool_ms: time spent in LangChain tools of the same top-level task since its previous LLM call.
- annotations: `kvscope.annotate(...)` values over the node's `kvscope` metadata, by row column.

Outside a LangGraph graph, a call an OpenAI Agents SDK agent makes is named by the SDK's run
context instead (probe/openai_agents.py states those rules): the agent's name, its run (trace) as
the workflow, the trace's group_id as thread, the k-th visit of the agent as its turn; a CrewAI
agent's by CrewAI's events (probe/crewai.py: the agent's role, the crew kickoff), an AutoGen
AgentChat agent's by AutoGen's runtime (probe/autogen.py: the speaking agent, the team run).
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from uuid import UUID

from kvscope.probe import autogen, crewai, labels, openai_agents, run_tracker
from kvscope.probe.langchain_context import current_config
from kvscope.probe.place import FrameworkPlace

_NONE: Mapping[str, Any] = MappingProxyType({})  # shared: no two containers a call to track


@dataclass(frozen=True)
class CallIdentity:
    """The row's identity columns for one call (None: not known for this call)."""

    agent_id: str | None = None
    graph_node: str | None = None
    thread_id: str | None = None
    workflow_run_id: str | None = None
    step: int | None = None
    turn_id: int | None = None
    previous_agent_id: str | None = None
    tool_ms: float | None = None
    annotations: Mapping[str, Any] = field(default_factory=lambda: _NONE)
    hints: Mapping[str, Any] = field(default_factory=lambda: _NONE)  # fixed_messages


_GIVEN: ContextVar["CallIdentity | None"] = ContextVar("kvscope_given_identity", default=None)


@contextmanager
def given(identity: "CallIdentity") -> Iterator[None]:
    """Every call made inside the block has exactly this identity (a live replay re-sends
    recorded calls under their original agent, workflow and transition); nothing is inferred."""
    token = _GIVEN.set(identity)
    try:
        yield
    finally:
        _GIVEN.reset(token)


def identify() -> CallIdentity:
    """The identity of a call made now, in this thread or task; registers it with the active
    tracker (so call it once per call, when the request is sent). Inside `given(...)`: that."""
    if (fixed := _GIVEN.get()) is not None:
        return fixed
    config = current_config()
    metadata: Mapping[str, Any] = config.get("metadata") or {}
    node_meta = metadata.get(labels.METADATA_KEY)
    node_meta = node_meta if isinstance(node_meta, Mapping) else {}
    path = run_tracker.node_path(metadata)
    tracker = run_tracker.active()
    run = _current_run(config)
    task = tracker.task_agent(run, metadata) if tracker is not None and path else None
    agent_id = (
        labels.current_agent() or node_meta.get("agent") or task or (path[0] if path else None)
    )
    known = (*labels.ANNOTATION_COLUMNS, *labels.PROMPT_HINTS)
    annotations = {k: v for k, v in node_meta.items() if k in known}
    annotations |= labels.current_annotations()
    columns = {
        labels.ANNOTATION_COLUMNS[k]: v
        for k, v in annotations.items()
        if k in labels.ANNOTATION_COLUMNS
    }
    hints = {k: v for k, v in annotations.items() if k in labels.PROMPT_HINTS}
    thread = (config.get("configurable") or {}).get("thread_id", metadata.get("thread_id"))
    ident = CallIdentity(
        agent_id=agent_id,
        graph_node="/".join(path) or None,
        thread_id=None if thread is None else str(thread),
        annotations=MappingProxyType(columns) if columns else _NONE,
        hints=MappingProxyType(hints) if hints else _NONE,
    )
    if not path and (sdk := framework_place()) is not None:  # another framework's agent
        return CallIdentity(
            agent_id=labels.current_agent() or sdk.agent_id,
            graph_node=sdk.graph_node,
            thread_id=sdk.thread_id,
            workflow_run_id=sdk.workflow_run_id,
            turn_id=sdk.turn_id,
            previous_agent_id=sdk.previous_agent_id,
            tool_ms=sdk.tool_ms,
            annotations=ident.annotations,
            hints=ident.hints,
        )
    if tracker is None or not path:
        return ident
    place = tracker.place(run, metadata, agent_id)
    if place is None:
        return ident
    return CallIdentity(
        agent_id=agent_id,
        graph_node=ident.graph_node,
        thread_id=ident.thread_id,
        workflow_run_id=place.workflow_run_id,
        step=place.step,
        turn_id=place.turn_id,
        previous_agent_id=place.previous_agent_id,
        tool_ms=place.tool_ms,
        annotations=ident.annotations,
        hints=ident.hints,
    )


# readers of frameworks' own run context (probe/place.py), tried in this order
FRAMEWORKS = (openai_agents, crewai, autogen)


def watch_frameworks() -> None:
    """Each framework reader installs as soon as its framework is imported (cheap, idempotent)."""
    for framework in FRAMEWORKS:
        framework.watch()


def framework_place() -> FrameworkPlace | None:
    """Where the call sits in the first framework's run that holds it; None: in none."""
    for framework in FRAMEWORKS:
        if (place := framework.place()) is not None:
            return place
    return None


def _current_run(config: Mapping[str, Any]) -> UUID | None:
    """The run whose code is running: the parent of whatever its callback manager starts."""
    return getattr(config.get("callbacks"), "parent_run_id", None)
