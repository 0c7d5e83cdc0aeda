"""What a workflow node may call: one LLM entry point and span helpers, nothing engine-specific.

The LangGraph nodes receive an `AgentRuntime`; kvscope's implementation (probe + MLflow tracing)
lives in kvscope.probe. Tests can pass any object with the same methods.
"""

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class CallIds:
    """The design note's identifier hierarchy for one agent call."""

    benchmark_run_id: str
    thread_id: str
    workflow_run_id: str
    turn_id: int  # the PEER cycle, from 1
    agent_id: str  # planner | executor | expresser | reviewer
    previous_agent_id: str | None  # None for the first call of a workflow
    graph_node: str


@dataclass(frozen=True)
class PromptInfo:
    template_version: str
    layout: str  # shared-first | role-first | synthetic
    sharing: str | None = None  # RQ5 sharing mode (tasks mode)
    fixed_messages: int = 1  # leading messages identical on every call of this agent


@dataclass(frozen=True)
class LlmReply:
    request_uuid: str
    content: str | None  # None when the call failed
    status: str  # kvscope.schema.STATUS_*
    error_type: str | None


@dataclass(frozen=True)
class LlmCall:
    """One model call an agent asks for: what the runtime sends, measures and traces."""

    messages: list[dict[str, str]]
    ids: CallIds
    max_tokens: int
    prompt: PromptInfo
    tool_ms: float | None = None  # the agent's tool time before this call
    ignore_eos: bool = False  # synthetic prompts: exactly max_tokens out


class ToolSpan(Protocol):
    def set_output(self, output: Any) -> None: ...


class AgentRuntime(Protocol):
    async def llm(self, call: LlmCall) -> LlmReply:
        """One model call: measured, recorded as one canonical row, traced as one LLM span."""
        ...

    def workflow_span(
        self, benchmark_run_id: str, thread_id: str, workflow_run_id: str
    ) -> AbstractContextManager[None]:
        """The root span of one workflow run: one MLflow trace per workflow."""
        ...

    def agent_span(self, ids: CallIds) -> AbstractContextManager[None]:
        """Span around one agent node (opened by the node, around its tool and LLM calls)."""
        ...

    def tool_span(self, name: str, inputs: dict[str, Any]) -> AbstractContextManager[ToolSpan]:
        """Span around one tool call."""
        ...
