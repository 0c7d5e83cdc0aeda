from pathlib import Path

import pytest

from kvscope.workload import prompts
from kvscope.workload.prompts import (
    AGENTS,
    STATE_LIMITS,
    TEMPLATE_VERSION,
    StateView,
    build_prompt,
    parse_verdict,
)
from kvscope.workload.taskset import load_tasks
from kvscope.workload.tools import calculate, format_hits, lookup

TOKENIZER = Path.home() / ".cache/kvscope/models/SmolLM2-135M-Instruct/tokenizer.json"
CONTEXT_TOKENS = 2048  # SmolLM2-135M
TASKS_PROMPT_BUDGET = 1300
MAX_TOKENS = 48


def _prompt(agent: str, state: StateView | None = None, cycle: int = 1) -> prompts.AgentPrompt:
    tasks = load_tasks()
    problem = tasks.problems[0]
    return build_prompt(
        agent,
        documents=tasks.documents_for(problem),
        question=problem.question,
        state=state or StateView(),
        cycle=cycle,
        tool_text="calculator: 14.88\n[doc] Revenue | 2,418.6 | 2,105.3",
    )


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_shared_first_shares_a_longer_system_prefix_than_role_first() -> None:
    planner, executor = _prompt("planner"), _prompt("executor")
    shared = _common_prefix(
        planner.messages("shared-first")[0]["content"],
        executor.messages("shared-first")[0]["content"],
    )
    role = _common_prefix(
        planner.messages("role-first")[0]["content"],
        executor.messages("role-first")[0]["content"],
    )
    assert shared >= len(planner.shared_context)
    assert role < 20
    assert shared > role + 1000


@pytest.mark.parametrize("agent", AGENTS)
def test_layouts_reorder_the_same_parts(agent: str) -> None:
    p = _prompt(agent, StateView(plan="CALC: 1 + 1"), cycle=2)
    first, second = p.messages("shared-first"), p.messages("role-first")
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1] == second[1]
    assert first[0]["content"].startswith(p.shared_context)
    assert second[0]["content"].startswith(p.agent_role)
    for text in (first[0]["content"], second[0]["content"]):
        assert p.agent_role in text and p.fixed_examples in text and p.shared_context in text
    assert sorted(first[0]["content"]) == sorted(second[0]["content"])
    assert first[1]["content"] == f"{p.dynamic_state}\n\n{p.current_input}"


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="layout"):
        _prompt("planner").messages("middle-first")  # type: ignore[arg-type]


def test_roles_are_distinct_and_reviewer_asks_for_a_verdict() -> None:
    assert len({prompts.ROLES[a] for a in AGENTS}) == 4
    assert len({prompts.EXAMPLES[a] for a in AGENTS}) == 4
    assert "VERDICT: DONE" in prompts.ROLES["reviewer"]
    assert "VERDICT: REVISE" in prompts.ROLES["reviewer"]
    assert "VERDICT: DONE" in _prompt("reviewer").current_input


def test_dynamic_state_carries_only_truncated_latest_values() -> None:
    long_plan = "CALC: 1 + 1 " + "x" * 1000
    state = StateView(plan=long_plan, review="Wrong unit.\n\n  VERDICT: REVISE")
    text = _prompt("planner", state, cycle=2).dynamic_state
    plan_line = next(line for line in text.splitlines() if line.startswith("Plan: "))
    assert len(plan_line) == len("Plan: ") + STATE_LIMITS["plan"]
    assert plan_line.endswith("...")
    assert "Review: Wrong unit. VERDICT: REVISE" in text
    assert "Execution result" not in text  # None fields are left out
    assert "cycle 2" in text
    assert "first step" in _prompt("planner").dynamic_state


def test_current_input_depends_on_agent_and_cycle() -> None:
    assert "Write the plan." in _prompt("planner").current_input
    assert "corrected plan" in _prompt("planner", cycle=2).current_input
    assert "calculator: 14.88" in _prompt("executor").current_input
    tasks = load_tasks()
    no_tools = build_prompt(
        "executor",
        documents=tasks.documents[:1],
        question="q?",
        state=StateView(),
        cycle=1,
    )
    assert "tools disabled" in no_tools.current_input


def test_prompt_info_records_template_version_and_layout() -> None:
    info = prompts.prompt_info("role-first")
    assert (info.template_version, info.layout) == (TEMPLATE_VERSION, "role-first")


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("Correct. VERDICT: DONE", "DONE"),
        ("verdict: revise", "REVISE"),
        ("**VERDICT:** DONE", "DONE"),
        ("VERDICT: REVISE ... on reflection VERDICT: DONE", "DONE"),
        ("Looks done to me.", None),
        ("VERDICT: DONEISH", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_verdict(text: str | None, verdict: str | None) -> None:
    assert parse_verdict(text) == verdict


def _chatml(messages: list[dict[str, str]]) -> str:
    """SmolLM2's chat template (ChatML), enough to count prompt tokens."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="SmolLM2 tokenizer not downloaded")
def test_prompts_fit_the_context_budget() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    # A reply of MAX_TOKENS digit-heavy tokens: the densest a field gets when the model runs
    # to its token limit (the char limits cut longer text).
    dense = "Revenue 2,418.6 (2023) vs 2,105.3 (2022); (2418.6 - 2105.3) / 2105.3 * 100. " * 9
    reply = tok.decode(tok.encode(dense).ids[:MAX_TOKENS])
    tasks = load_tasks()
    worst_realistic = worst_dense = 0
    for problem in tasks.problems:
        docs = tasks.documents_for(problem)
        calc = calculate(problem.expression).text
        hits = format_hits(lookup(problem.question, [(d.id, d.text) for d in docs]))
        tool_text = f"{calc}\n{hits}"
        realistic = StateView(reply, f"{calc} | {reply}", reply, reply)
        cut = StateView(dense, dense, dense, dense)
        for agent in AGENTS:
            for state, is_dense in ((realistic, False), (cut, True)):
                prompt = build_prompt(
                    agent,
                    documents=docs,
                    question=problem.question,
                    state=state,
                    cycle=3,
                    tool_text=dense if is_dense else tool_text,
                )
                for layout in ("shared-first", "role-first"):
                    n = len(tok.encode(_chatml(prompt.messages(layout))).ids)
                    if is_dense:
                        worst_dense = max(worst_dense, n)
                    else:
                        worst_realistic = max(worst_realistic, n)
    assert worst_realistic <= TASKS_PROMPT_BUDGET
    assert worst_dense + MAX_TOKENS <= CONTEXT_TOKENS
