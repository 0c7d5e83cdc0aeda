"""What only the app knows, said around its calls: `kvscope.agent(...)` and `kvscope.annotate(...)`.

    with kvscope.agent("planner"):          # every call inside is the planner's
        client.chat.completions.create(...)
    with kvscope.annotate(prompt_template_version="v3", layout="shared-first"):
        graph.invoke(...)

Both are context variables: they hold for the code inside the block, in the thread or task that
entered it and in the tasks and LangGraph nodes it starts; blocks nest (the innermost agent wins,
annotations merge, inner keys winning). The same can be put on a LangGraph node, as node metadata:
`add_node("plan", fn, metadata={"kvscope": {"agent": "planner", "layout": "role-first"}})`.
An explicit `agent(...)` wins over node metadata, which wins over the node's name.
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

# annotate()'s keys -> the request row's columns they fill
ANNOTATION_COLUMNS: Mapping[str, str] = MappingProxyType(
    {
        "prompt_template_version": "prompt_template_version",
        "layout": "prompt_layout",
        "sharing": "sharing_mode",
        "fixed_prefix_tokens": "fixed_prefix_tokens",
    }
)
# annotate()'s keys that are not columns but tell kvscope how to read the prompt
PROMPT_HINTS: tuple[str, ...] = (
    "fixed_messages",  # how many leading messages are the fixed part (-> fixed_prefix_tokens)
)
METADATA_KEY = "kvscope"  # node metadata: {"kvscope": {"agent": ..., <annotate keys>...}}

_AGENT: ContextVar[str | None] = ContextVar("kvscope_agent", default=None)
_ANNOTATIONS: ContextVar[Mapping[str, Any]] = ContextVar(
    "kvscope_annotations", default=MappingProxyType({})
)


@contextmanager
def agent(agent_id: str) -> Iterator[None]:
    """Name the agent of every LLM call made inside the block (overrides LangGraph's node)."""
    if not agent_id:
        raise ValueError("agent() needs a non-empty agent id")
    token = _AGENT.set(agent_id)
    try:
        yield
    finally:
        _AGENT.reset(token)


@contextmanager
def annotate(**values: Any) -> Iterator[None]:
    """Fill prompt-instrumentation columns of every call inside the block: prompt_template_version,
    layout (-> prompt_layout), sharing (-> sharing_mode), fixed_prefix_tokens; or say how to
    read its prompt: fixed_messages (the leading messages that are the fixed part; kvscope counts
    their tokens into fixed_prefix_tokens). Unknown keys are refused (ValueError), so that a typo
    does not pass silently."""
    check_annotations(values)
    token = _ANNOTATIONS.set(MappingProxyType({**_ANNOTATIONS.get(), **values}))
    try:
        yield
    finally:
        _ANNOTATIONS.reset(token)


def check_annotations(values: Mapping[str, Any]) -> None:
    unknown = sorted(set(values) - set(ANNOTATION_COLUMNS) - set(PROMPT_HINTS))
    if unknown:
        known = ", ".join([*ANNOTATION_COLUMNS, *PROMPT_HINTS])
        raise ValueError(f"unknown annotation {', '.join(unknown)} (known: {known})")


def current_agent() -> str | None:
    """The agent named by the innermost `agent(...)` block, if any."""
    return _AGENT.get()


def current_annotations() -> Mapping[str, Any]:
    """The merged `annotate(...)` values in force, by annotate()'s keys."""
    return _ANNOTATIONS.get()
