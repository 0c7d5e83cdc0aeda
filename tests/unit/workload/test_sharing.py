"""RQ5 sharing modes: what each mode shares, the default's exact prompts, branch growth, budget."""

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import ROOT
from peer_engine import BASE, ScriptedEngine

from kvscope.config import WorkloadConfig, load_yaml, parse_experiment
from kvscope.errors import ConfigError
from kvscope.workload import prompts, sharing
from kvscope.workload.driver import assign_tasks, run_workflows
from kvscope.workload.prompts import AGENTS, PromptInfo, StateView
from kvscope.workload.taskset import load_tasks
from kvscope.workload.tools import calculate, format_hits, lookup

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER = Path.home() / ".cache/kvscope/models/SmolLM2-135M-Instruct/tokenizer.json"
needs_tokenizer = pytest.mark.skipif(not TOKENIZER.is_file(), reason="SmolLM2 not downloaded")
CONTEXT_TOKENS = 2048  # SmolLM2-135M
MAX_TOKENS = 48
# Branch mode with short replies and the real tool results (measured: 1,524 tokens at worst).
BRANCH_PROMPT_BUDGET = 1600
MODES = ("none", "system", "task", "documents", "branch")
REPLIES = {
    "planner": "CALC: (2418.6 - 2105.3) / 2105.3 * 100\nSteps: growth.",
    "executor": "Revenue 2,418.6 vs 2,105.3; growth 14.88%.",
    "expresser": "Revenue grew 14.88%.",
    "reviewer": "Matches. VERDICT: REVISE",
}
# sha256 of the demo's 32 prompts (configs/demo.yaml, one workflow at a time, the replies
# above), rendered by the code before the sharing modes existed (template peer-fqa-v1).
DEMO_PROMPTS_SHA256 = {
    "shared-first": "935620ef668333ad1e600fdbcceb19b5f76d14812e89b68f21de3b5703db5e1b",
    "role-first": "9e6b7774b285e46adf6543faeacc8ed8fc56ee4b82ef47a18b8792ad88389642",
}


@dataclass(frozen=True)
class Ids:
    thread_id: str
    turn_id: int
    agent_id: str


class Recorder:
    """Each call's identity, messages and prompt annotations, from a scripted engine."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self.calls: list[tuple[Ids, list[dict[str, str]], PromptInfo]] = [
            (Ids(c.thread_id, c.turn, c.agent), c.messages, prompt_info(c.meta))
            for c in engine.calls
        ]


def prompt_info(meta: dict[str, Any]) -> PromptInfo:
    return PromptInfo(
        meta["prompt_template_version"], meta["layout"], meta.get("sharing"),
        meta["fixed_messages"],
    )  # fmt: skip


def record(cfg: WorkloadConfig, run_id: str = "pin") -> Recorder:
    engine = ScriptedEngine(reply=lambda call: REPLIES[call.agent])
    asyncio.run(run_workflows(BASE, "smollm2", cfg, thread_prefix=run_id, client=engine.client()))
    return Recorder(engine)


def one_workflow(sharing_mode: str, cycles: int = 2, **kw: Any) -> Recorder:
    return record(WorkloadConfig(workflows=1, concurrency=1, cycles=cycles, sharing=sharing_mode,
                                 **kw))  # fmt: skip


def chatml(messages: list[dict[str, str]]) -> str:
    """SmolLM2's chat template (ChatML) with the generation prompt."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture(scope="module")
def tok() -> "Tokenizer":
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))


def ids_of(tok: "Tokenizer", messages: list[dict[str, str]]) -> list[int]:
    return tok.encode(chatml(messages)).ids


@pytest.mark.parametrize("layout", ["shared-first", "role-first"])
def test_the_default_renders_the_demo_prompts_byte_for_byte(layout: str) -> None:
    demo = parse_experiment(load_yaml(ROOT / "configs" / "demo.yaml")).workload
    assert demo.sharing == "documents"  # the default
    rt = record(demo.model_copy(update={"layout": layout}))
    calls = sorted((i.thread_id, i.turn_id, i.agent_id, m) for i, m, _ in rt.calls)
    text = json.dumps(calls, sort_keys=True)
    assert len(calls) == 32
    assert hashlib.sha256(text.encode()).hexdigest() == DEMO_PROMPTS_SHA256[layout]
    assert {p for _, _, p in rt.calls} == {
        PromptInfo(prompts.TEMPLATE_VERSION, layout, "documents", fixed_messages=1)
    }


@pytest.mark.parametrize("mode", MODES)
def test_prompt_info_names_the_mode_and_its_fixed_messages_hold(mode: str) -> None:
    rt = one_workflow(mode, cycles=3)
    by_agent: dict[str, list[list[dict[str, str]]]] = {}
    for ids, messages, info in rt.calls:
        assert (info.sharing, info.layout, info.fixed_messages) == (mode, "shared-first", 1)
        by_agent.setdefault(ids.agent_id, []).append(messages)
    for calls in by_agent.values():
        assert len(calls) == 3
        fixed = calls[0][:1]
        assert all(c[:1] == fixed for c in calls)  # the system message: fixed
        assert len({json.dumps(c[1:]) for c in calls}) == 3  # the rest: never the same twice


@pytest.mark.parametrize("mode", ["none", "system", "task"])
def test_modes_rearrange_the_same_parts(mode: str) -> None:
    rt = one_workflow(mode, cycles=1)
    docs_rt = one_workflow("documents", cycles=1)
    task = assign_tasks(load_tasks(), 1, seed=0)[0]  # what run_workflows gives workflow 0
    docs_text = prompts.documents_text(load_tasks().documents_for(task))
    for (ids, messages, _), (_, reference, _) in zip(rt.calls, docs_rt.calls, strict=True):
        system, user = messages
        assert user == reference[1]  # dynamic state + current input, unchanged
        parts = system["content"].split("\n\n")
        role, examples = prompts.ROLES[ids.agent_id], prompts.EXAMPLES[ids.agent_id]
        for part in (role, examples, prompts.SHARED_PREAMBLE, f"Task: {task.question}"):
            assert part in parts
        assert docs_text in system["content"]
        first = {"none": role, "system": prompts.SHARED_PREAMBLE}.get(mode)
        if first is not None:
            assert parts[0] == first
        else:
            assert parts[:2] == [prompts.SHARED_PREAMBLE, f"Task: {task.question}"]
        assert system["content"].index(role) < system["content"].index(docs_text)


@pytest.mark.parametrize("mode", ["system", "task", "documents"])
def test_role_first_moves_the_role_to_the_front(mode: str) -> None:
    shared = one_workflow(mode, cycles=1)
    role_first = one_workflow(mode, cycles=1, layout="role-first")
    for (ids, a, _), (_, b, _) in zip(shared.calls, role_first.calls, strict=True):
        role = prompts.ROLES[ids.agent_id]
        assert b[0]["content"].startswith(role + "\n\n")
        assert sorted(a[0]["content"].split("\n\n")) == sorted(b[0]["content"].split("\n\n"))
        assert a[1] == b[1]


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"sharing": "none", "layout": "role-first"}, "none already starts"),
        ({"sharing": "branch", "layout": "role-first"}, "same for every agent"),
        ({"sharing": "task", "mode": "synthetic"}, "tasks-mode setting"),
        ({"sharing": "everything"}, "workload.sharing"),
    ],
)
def test_meaningless_combinations_are_one_line_config_errors(
    workload: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_experiment({"workload": workload}, "x.yaml")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("x.yaml: workload")


def test_synthetic_mode_keeps_its_default_sharing() -> None:
    cfg = parse_experiment({"workload": {"mode": "synthetic"}})
    assert cfg.workload.sharing == "documents"  # a round trip of a dumped config still loads
    assert parse_experiment(cfg.model_dump(mode="json")) == cfg


@needs_tokenizer
def test_shared_prefix_across_agents_grows_none_system_task_documents(tok: "Tokenizer") -> None:
    shared: dict[str, int] = {}
    for mode in MODES:
        calls = one_workflow(mode, cycles=1).calls
        planner, executor = (ids_of(tok, m) for _, m, _ in calls[:2])
        shared[mode] = common_prefix(planner, executor)
    assert shared["none"] <= 8  # "<|im_start|>system\nRole:" and nothing else
    assert shared["none"] < shared["system"] < shared["task"] < shared["documents"]
    assert shared["system"] >= len(tok.encode(prompts.SHARED_PREAMBLE).ids)
    assert shared["documents"] > 300  # the documents: hundreds of tokens
    # branch: the Executor's prompt extends the Planner's whole prompt
    assert shared["branch"] == len(ids_of(tok, one_workflow("branch", cycles=1).calls[0][1]))
    assert shared["branch"] > shared["documents"]


@needs_tokenizer
def test_branch_extends_the_previous_calls_prompt(tok: "Tokenizer") -> None:
    calls = one_workflow("branch", cycles=3).calls
    assert len(calls) == 12
    sent = [ids_of(tok, m) for _, m, _ in calls]
    system = ids_of(tok, calls[0][1][:1])[:-3]  # without the generation prompt
    for k in range(1, 12):
        (prev_ids, prev, _), (ids, now, _) = calls[k - 1], calls[k]
        assert sent[k][: len(system)] == system
        if (ids.turn_id, ids.agent_id) == (3, "planner"):
            # the bound: cycle 3 carries cycles 2 and 3 only, so the chain restarts here
            assert sent[k][: len(sent[k - 1])] != sent[k - 1]
            assert [m["content"] for m in now[1:3]] == [m["content"] for m in calls[4][1][-1:]] + [
                REPLIES["planner"]
            ]
            continue
        assert sent[k][: len(sent[k - 1])] == sent[k - 1], (prev_ids, ids)
        assert now[: len(prev)] == prev
        assert now[len(prev)] == {"role": "assistant", "content": REPLIES[prev_ids.agent_id]}
        assert len(now) == len(prev) + 2


# Digit-heavy text, the densest a field gets (as in tests/unit/workload/test_workload_prompts.py).
DENSE = "Revenue 2,418.6 (2023) vs 2,105.3 (2022); (2418.6 - 2105.3) / 2105.3 * 100. " * 9


def _dense_reply(tok: "Tokenizer") -> str:
    """A reply of MAX_TOKENS dense tokens: the model running to its token limit."""
    return tok.decode(tok.encode(DENSE).ids[:MAX_TOKENS])


@needs_tokenizer
@pytest.mark.parametrize("mode", ["none", "system", "task"])
def test_rearranged_modes_fit_the_context(tok: "Tokenizer", mode: str) -> None:
    tasks, worst = load_tasks(), 0
    for problem in tasks.problems:
        docs = tasks.documents_for(problem)
        state = StateView(DENSE, DENSE, DENSE, DENSE)
        for agent in AGENTS:
            for layout in ("shared-first", "role-first") if mode != "none" else ("shared-first",):
                messages = sharing.messages(
                    agent, documents=docs, question=problem.question, state=state, cycle=3,
                    sharing=mode, layout=layout, tool_text=DENSE,  # type: ignore[arg-type]
                )  # fmt: skip
                worst = max(worst, len(ids_of(tok, messages)))
    assert worst + MAX_TOKENS <= CONTEXT_TOKENS


@needs_tokenizer
@pytest.mark.parametrize("cycles", [2, 4])
def test_branch_fits_the_context_over_any_number_of_cycles(tok: "Tokenizer", cycles: int) -> None:
    reply, tasks = _dense_reply(tok), load_tasks()
    worst_dense = worst_realistic = 0
    for problem in tasks.problems:
        docs = tasks.documents_for(problem)
        calc = calculate(problem.expression).text
        hits = format_hits(lookup(problem.question, [(d.id, d.text) for d in docs]))
        for dense in (True, False):
            turns: list[sharing.Turn] = []
            for cycle in range(1, cycles + 1):
                for agent in AGENTS:
                    messages = sharing.branch_messages(
                        agent, documents=docs, question=problem.question, cycle=cycle,
                        tool_text=DENSE if dense else f"{calc}\n{hits}", turns=turns,
                    )  # fmt: skip
                    n = len(ids_of(tok, messages))
                    if dense:
                        worst_dense = max(worst_dense, n)
                    else:
                        worst_realistic = max(worst_realistic, n)
                    answer = reply if dense else REPLIES[agent]
                    turns.append(sharing.Turn(cycle, messages[-1]["content"], answer))
    assert worst_dense + MAX_TOKENS <= CONTEXT_TOKENS
    assert worst_realistic <= BRANCH_PROMPT_BUDGET


def test_carried_turns_keep_the_current_and_the_previous_cycle() -> None:
    turns = [sharing.Turn(c, f"asked {c}{a}", "x") for c in (1, 2, 3) for a in "pe"]
    assert sharing.carried_turns(turns[:2], 1) == turns[:2]
    assert sharing.carried_turns(turns[:4], 2) == turns[:4]
    assert sharing.carried_turns(turns, 3) == turns[2:]
    assert sharing.BRANCH_CYCLES == 2
