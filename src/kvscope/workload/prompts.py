"""PEER agent prompts for tasks mode, decomposed as the design note's Phase 7 describes.

agent_prompt = shared_context + agent_role + fixed_examples + dynamic_state + current_input

The two layouts differ only in the order of the system message's parts (RQ3): "shared-first"
puts the context every agent shares (team preamble + documents) first, so the four agents'
prompts share a long token prefix; "role-first" puts the agent's role first, so they diverge
after a few tokens. The user message (dynamic state + current input) is the same in both.

These are the prompts of `workload.sharing: documents` (the default); kvscope.workload.sharing
rearranges the same parts for the other RQ5 sharing modes.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvscope.config import Layout, Sharing
from kvscope.workload.taskset import Document

# Unchanged by the RQ5 sharing modes: `documents` renders these prompts byte for byte, and the
# other modes are recorded beside the version (PromptInfo.sharing, the sharing_mode column).
TEMPLATE_VERSION = "peer-fqa-v1"
AGENTS: tuple[str, ...] = ("planner", "executor", "expresser", "reviewer")

# Bounds, in characters, on what the dynamic state carries: only the latest value of each
# field, cut so that a two-document task still fits SmolLM2-135M's 2,048-token context
# with room for the reply (the measured budget: tests/unit/workload/test_workload_prompts.py).
STATE_LIMITS: dict[str, int] = {
    "plan": 200,
    "execution_result": 240,
    "expression": 200,
    "review": 200,
}
TOOL_TEXT_LIMIT = 300

SHARED_PREAMBLE = (
    "You are one agent of a four-agent financial analysis team (Planner, Executor, Expresser, "
    "Reviewer) that answers questions about company reports. Use only the numbers in the "
    "documents below, in the units the documents state."
)

ROLES: dict[str, str] = {
    "planner": (
        "Role: Planner. Decide which figures to take from the documents and how to combine "
        "them. First line: CALC: <arithmetic expression over those numbers>. Second line: the "
        "steps, briefly. If a review asks for changes, correct the plan."
    ),
    "executor": (
        "Role: Executor. Carry out the plan with the tool results (the document lines found and "
        "the calculator value). Report the figures used and the computed value, nothing else."
    ),
    "expresser": (
        "Role: Expresser. Write the final answer for the user in one sentence: the value "
        "rounded to two decimals, its unit, and what it measures."
    ),
    "reviewer": (
        "Role: Reviewer. Check the answer draft against the documents and the calculation. Give "
        "one short reason, then end with exactly VERDICT: DONE if it is correct and complete, "
        "or VERDICT: REVISE if it is not."
    ),
}

EXAMPLES: dict[str, str] = {
    "planner": (
        "Examples:\n"
        "Question: What was Example Co.'s gross margin in 2023?\n"
        "Plan: CALC: 412.5 / 1500.0 * 100\n"
        "Steps: 2023 gross profit 412.5 over revenue 1,500.0.\n"
        "Question: By what percentage did Example Co.'s orders grow in 2023?\n"
        "Plan: CALC: (96.0 - 80.0) / 80.0 * 100\n"
        "Steps: change from 2022 (80.0) to 2023 (96.0), over the 2022 value."
    ),
    "executor": (
        "Examples:\n"
        "Tool results: calculator: 27.5\n"
        "Result: gross profit 412.5, revenue 1,500.0; gross margin 27.5%.\n"
        "Tool results: calculator error: no expression; [ex] Orders | 96.0 | 80.0\n"
        "Result: orders 96.0 (2023) and 80.0 (2022); growth (96.0 - 80.0) / 80.0 = 20.0%."
    ),
    "expresser": (
        "Examples:\n"
        "Result: gross profit 412.5, revenue 1,500.0; gross margin 27.5%.\n"
        "Answer: Example Co.'s 2023 gross margin was 27.50%.\n"
        "Result: orders 96.0 (2023) and 80.0 (2022); growth 20.0%.\n"
        "Answer: Example Co.'s orders grew by 20.00% in 2023."
    ),
    "reviewer": (
        "Examples:\n"
        "Answer: Example Co.'s 2023 gross margin was 27.50%.\n"
        "Review: Figures match the report and 412.5 / 1500.0 = 27.5%. VERDICT: DONE\n"
        "Answer: Example Co.'s orders grew by 16.0 in 2023.\n"
        "Review: The question asks for a percentage: 16.0 / 80.0 = 20.0%. VERDICT: REVISE"
    ),
}

_STATE_LABELS: dict[str, str] = {
    "plan": "Plan",
    "execution_result": "Execution result",
    "expression": "Answer draft",
    "review": "Review",
}


@dataclass(frozen=True)
class PromptInfo:
    """What the app knows about its prompts; reaches the rows as annotations (peer.annotations)."""

    template_version: str
    layout: str  # shared-first | role-first | synthetic
    sharing: str | None = None  # RQ5 sharing mode (tasks mode)
    fixed_messages: int = 1  # leading messages identical on every call of this agent


@dataclass(frozen=True)
class StateView:
    """The latest value of each workflow field, as the next agent sees it."""

    plan: str | None = None
    execution_result: str | None = None
    expression: str | None = None
    review: str | None = None


@dataclass(frozen=True)
class AgentPrompt:
    shared_context: str
    agent_role: str
    fixed_examples: str
    dynamic_state: str
    current_input: str

    def messages(self, layout: Layout) -> list[dict[str, str]]:
        if layout == "shared-first":
            system = [self.shared_context, self.agent_role, self.fixed_examples]
        elif layout == "role-first":
            system = [self.agent_role, self.shared_context, self.fixed_examples]
        else:
            raise ValueError(f"unknown prompt layout {layout!r}")
        return [
            {"role": "system", "content": "\n\n".join(system)},
            {"role": "user", "content": f"{self.dynamic_state}\n\n{self.current_input}"},
        ]


def prompt_info(layout: Layout, sharing: Sharing = "documents") -> PromptInfo:
    # Every tasks-mode prompt has one fixed message: the system message (sharing.py).
    return PromptInfo(
        template_version=TEMPLATE_VERSION, layout=layout, sharing=sharing, fixed_messages=1
    )


def shared_context(documents: Sequence[Document]) -> str:
    return f"{SHARED_PREAMBLE}\n\n{documents_text(documents)}"


def documents_text(documents: Sequence[Document]) -> str:
    parts = ["Documents:"]
    for doc in documents:
        parts.append(f"### [{doc.id}] {doc.company}, {doc.period} {doc.kind}\n{doc.text}")
    return "\n\n".join(parts)


def dynamic_state(state: StateView, cycle: int) -> str:
    lines = [f"Workflow state (cycle {cycle}):"]
    for field, label in _STATE_LABELS.items():
        value = getattr(state, field)
        if value:
            lines.append(f"{label}: {truncate(value, STATE_LIMITS[field])}")
    if len(lines) == 1:
        lines.append("(empty: this is the first step)")
    return "\n".join(lines)


def current_input(agent: str, question: str, *, cycle: int, tool_text: str | None = None) -> str:
    return f"Question: {question}\n{instruction(agent, cycle=cycle, tool_text=tool_text)}"


def instruction(agent: str, *, cycle: int, tool_text: str | None = None) -> str:
    """What the agent is asked to do now (the current input without the question)."""
    if agent == "planner":
        if cycle > 1:
            return "The review asked for another cycle: write a corrected plan."
        return "Write the plan."
    if agent == "executor":
        tools = truncate(tool_text, TOOL_TEXT_LIMIT) if tool_text else "none (tools disabled)"
        return f"Tool results: {tools}\nWrite the result."
    if agent == "expresser":
        return "Write the answer."
    if agent == "reviewer":
        return "Review the answer draft; end with VERDICT: DONE or VERDICT: REVISE."
    raise ValueError(f"unknown agent {agent!r}")


def build_prompt(
    agent: str,
    *,
    documents: Sequence[Document],
    question: str,
    state: StateView,
    cycle: int,
    tool_text: str | None = None,
) -> AgentPrompt:
    return AgentPrompt(
        shared_context=shared_context(documents),
        agent_role=ROLES[agent],
        fixed_examples=EXAMPLES[agent],
        dynamic_state=dynamic_state(state, cycle),
        current_input=current_input(agent, question, cycle=cycle, tool_text=tool_text),
    )


_SPACE = re.compile(r"\s+")


def truncate(text: str, limit: int) -> str:
    """Whitespace collapsed, then cut to `limit` characters ("..." marks a cut)."""
    flat = _SPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


Verdict = Literal["DONE", "REVISE"]
_VERDICT = re.compile(r"VERDICT\s*:\s*\**\s*(DONE|REVISE)\b", re.IGNORECASE)


def parse_verdict(text: str | None) -> Verdict | None:
    """The Reviewer's last `VERDICT: DONE|REVISE`, or None when it wrote none."""
    found = _VERDICT.findall(text or "")
    if not found:
        return None
    return "DONE" if found[-1].upper() == "DONE" else "REVISE"
