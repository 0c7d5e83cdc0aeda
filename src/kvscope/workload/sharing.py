"""RQ5 prefix-sharing modes (`workload.sharing`, tasks mode): what the four agents' prompts share.

Every mode sends the same parts (prompts.py): the team preamble P, the task line T ("Task: <the
question>"), the task's documents D, the agent's role R and few-shot examples E in the system
message, then the dynamic state and the current input in the user message. The modes differ in
where P, T and D go relative to the role: everything in front of R is the same for all four
agents, so each mode below shares a longer token prefix across agents than the one before it.

  mode        system message (layout shared-first)    shared by all four agents
  none        R | E | P | T | D                       nothing (the chat template's first tokens)
  system      P | R | E | T | D                       the preamble
  task        P | T | R | E | D                       the preamble and the task
  documents   P | D | R | E  (the default)            the preamble and the documents
  branch      P | D | T | all roles, then the turns   the whole earlier conversation

`documents` renders prompts.py's prompts byte for byte (template peer-fqa-v1, which has no T:
the question is in the user message of every mode). PEER's few-shot examples show one agent's
own output format, so they are the agent's, not shared, in every mode.

`branch` reuses a complete earlier conversation branch. The system message is the same for all
agents (P, D, T and the four roles), and each call carries the workflow's earlier calls as
user/assistant messages (what each agent was asked: "<Agent>, your turn." + its instruction;
and what it answered), then its own request. A call's prompt is therefore the previous call's
prompt + that call's reply + a new user message: consecutive calls share the whole earlier
conversation, across agents. The conversation replaces the dynamic-state summary; the question
and the roles sit once in the system message; the Executor's tool results are cut to 200
characters and the examples are left out, so that two PEER cycles fit SmolLM2's 2,048-token
context (measured in tests/unit/workload/test_sharing.py). Bound: a call carries the turns of its
own cycle and of the previous one (BRANCH_CYCLES), at most 7 turns; from cycle 3 on the branch is
thus re-rooted at each cycle's Planner, where the chain of prefix extensions restarts.

Layout (RQ3) stays the order switch: role-first moves the role R to the very front of the system
message, so agents share no prefix with each other (an agent's own calls still share their whole
system message). It combines with system, task and documents (documents + role-first = the
role-first prompts of peer-fqa-v1); with none it would change nothing (none already starts with
R) and with branch it would break the branch (its system message must be every agent's), so the
configuration refuses those two (kvscope.config.WorkloadConfig).

In every mode the system message is the one message that is identical on every call of an agent in
a workflow (PromptInfo.fixed_messages = 1); in branch mode the earlier turns are the workflow's
dynamic state: never rewritten, but they grow with each call.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from kvscope.config import Layout, Sharing
from kvscope.workload import prompts
from kvscope.workload.taskset import Document

BRANCH_CYCLES = 2  # branch mode: a call carries the turns of its own cycle and the previous one
BRANCH_TOOL_TEXT_LIMIT = 200  # characters; the Executor's tool results ride along in later turns

Message = dict[str, str]


@dataclass(frozen=True)
class Turn:
    """One earlier call of the workflow, as branch mode replays it."""

    cycle: int
    asked: str  # the last (user) message the agent was sent
    answer: str  # its reply


def task_line(question: str) -> str:
    return f"Task: {question}"


def messages(
    agent: str,
    *,
    documents: Sequence[Document],
    question: str,
    state: prompts.StateView,
    cycle: int,
    sharing: Sharing,
    layout: Layout,
    tool_text: str | None = None,
    turns: Sequence[Turn] = (),
) -> list[Message]:
    """The chat messages of one agent call in the given sharing mode and layout."""
    if sharing == "branch":
        if layout != "shared-first":
            raise ValueError("sharing branch needs layout shared-first")
        return branch_messages(
            agent,
            documents=documents,
            question=question,
            cycle=cycle,
            tool_text=tool_text,
            turns=turns,
        )
    prompt = prompts.build_prompt(
        agent,
        documents=documents,
        question=question,
        state=state,
        cycle=cycle,
        tool_text=tool_text,
    )
    if sharing == "documents":
        return prompt.messages(layout)
    parts = _system_parts(prompt, sharing, documents, question)
    if layout == "role-first":
        if sharing == "none":
            raise ValueError("sharing none needs layout shared-first")
        parts.remove(prompt.agent_role)
        parts.insert(0, prompt.agent_role)
    return [
        {"role": "system", "content": "\n\n".join(parts)},
        {"role": "user", "content": f"{prompt.dynamic_state}\n\n{prompt.current_input}"},
    ]


def _system_parts(
    prompt: prompts.AgentPrompt, sharing: Sharing, documents: Sequence[Document], question: str
) -> list[str]:
    role, examples = prompt.agent_role, prompt.fixed_examples
    preamble, task = prompts.SHARED_PREAMBLE, task_line(question)
    docs = prompts.documents_text(documents)
    if sharing == "none":
        return [role, examples, preamble, task, docs]
    if sharing == "system":
        return [preamble, role, examples, task, docs]
    if sharing == "task":
        return [preamble, task, role, examples, docs]
    raise ValueError(f"unknown sharing mode {sharing!r}")


def branch_messages(
    agent: str,
    *,
    documents: Sequence[Document],
    question: str,
    cycle: int,
    tool_text: str | None = None,
    turns: Sequence[Turn] = (),
) -> list[Message]:
    """Shared system message, the carried earlier turns, then this agent's request."""
    roles = "\n".join(prompts.ROLES[a] for a in prompts.AGENTS)
    system = "\n\n".join([prompts.shared_context(documents), task_line(question), roles])
    out: list[Message] = [{"role": "system", "content": system}]
    for turn in carried_turns(turns, cycle):
        out.append({"role": "user", "content": turn.asked})
        out.append({"role": "assistant", "content": turn.answer})
    out.append({"role": "user", "content": branch_request(agent, cycle=cycle, tool_text=tool_text)})
    return out


def branch_request(agent: str, *, cycle: int, tool_text: str | None = None) -> str:
    """The user message of one branch turn: which agent speaks, and what it is asked now."""
    tools = prompts.truncate(tool_text, BRANCH_TOOL_TEXT_LIMIT) if tool_text else None
    ask = prompts.instruction(agent, cycle=cycle, tool_text=tools)
    return f"{agent.capitalize()}, your turn. {ask}"


def carried_turns(turns: Sequence[Turn], cycle: int) -> list[Turn]:
    """The earlier turns a call in `cycle` carries: those of the last BRANCH_CYCLES cycles."""
    return [t for t in turns if t.cycle > cycle - BRANCH_CYCLES]
