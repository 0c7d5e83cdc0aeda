import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvscope.config import SyntheticConfig, WorkloadConfig
from kvscope.errors import ConfigError
from kvscope.records.requests import STATUS_ERROR, STATUS_OK
from kvscope.workload.driver import WorkflowResult, assign_tasks, run_workflows
from kvscope.workload.prompts import TEMPLATE_VERSION
from kvscope.workload.runtime import CallIds, LlmCall, LlmReply, PromptInfo
from kvscope.workload.taskset import load_tasks
from kvscope.workload.tools import calculate

TOKENIZER = Path.home() / ".cache/kvscope/models/SmolLM2-135M-Instruct/tokenizer.json"
RUN = "bench-test"
ORDER = ["planner", "executor", "expresser", "reviewer"]
PLAN = "CALC: (2418.6 - 2105.3) / 2105.3 * 100\nSteps: growth over 2022."


@dataclass
class Call:
    ids: CallIds
    messages: list[dict[str, str]]
    max_tokens: int
    prompt: PromptInfo
    tool_ms: float | None
    ignore_eos: bool
    tools_before: list[str]  # tool spans closed inside this agent span before the call


@dataclass
class ToolRecord:
    agent: CallIds | None
    name: str
    inputs: dict[str, Any]
    output: Any = None


class _Span:
    def __init__(self, record: ToolRecord) -> None:
        self.record = record

    def set_output(self, output: Any) -> None:
        self.record.output = output


Replier = Callable[[CallIds], str]


def default_reply(ids: CallIds) -> str:
    return {
        "planner": PLAN,
        "executor": "Revenue 2,418.6 vs 2,105.3; growth 14.88%.",
        "expresser": "Revenue grew 14.88%.",
        "reviewer": "Matches. VERDICT: DONE",
    }[ids.agent_id]


@dataclass
class FakeRuntime:
    """An AgentRuntime that records everything and answers with canned replies."""

    reply: Replier = default_reply
    fail: Callable[[CallIds], bool] = lambda ids: False
    delay_s: float = 0.0
    calls: list[Call] = field(default_factory=list)
    tools: list[ToolRecord] = field(default_factory=list)
    workflows: list[tuple[str, str, str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    _agent: ContextVar[CallIds | None] = field(default_factory=lambda: ContextVar("agent"))
    _tools: ContextVar[list[str] | None] = field(default_factory=lambda: ContextVar("tools"))

    async def llm(self, call: LlmCall) -> LlmReply:
        ids = call.ids
        assert self._agent.get(None) == ids, "llm called outside its own agent span"
        tools_before = list(self._tools.get(None) or [])
        self.calls.append(Call(ids, call.messages, call.max_tokens, call.prompt, call.tool_ms,
                               call.ignore_eos, tools_before))  # fmt: skip
        await asyncio.sleep(self.delay_s)
        request_uuid = str(uuid.uuid4())
        if self.fail(ids):
            return LlmReply(request_uuid, None, STATUS_ERROR, "HTTPStatusError")
        return LlmReply(request_uuid, self.reply(ids), STATUS_OK, None)

    @contextmanager
    def workflow_span(
        self, benchmark_run_id: str, thread_id: str, workflow_run_id: str
    ) -> Iterator[None]:
        self.workflows.append((benchmark_run_id, thread_id, workflow_run_id))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1

    @contextmanager
    def agent_span(self, ids: CallIds) -> Iterator[None]:
        token, tools = self._agent.set(ids), self._tools.set([])
        try:
            yield
        finally:
            self._agent.reset(token)
            self._tools.reset(tools)

    @contextmanager
    def tool_span(self, name: str, inputs: dict[str, Any]) -> Iterator[_Span]:
        record = ToolRecord(self._agent.get(None), name, inputs)
        self.tools.append(record)
        yield _Span(record)
        opened = self._tools.get(None)
        assert opened is not None, "tool span outside an agent span"
        opened.append(name)

    def by_thread(self) -> dict[str, list[Call]]:
        out: dict[str, list[Call]] = {}
        for call in self.calls:
            out.setdefault(call.ids.thread_id, []).append(call)
        return out


def run(runtime: FakeRuntime, cfg: WorkloadConfig, **kwargs: Any) -> list[WorkflowResult]:
    return asyncio.run(run_workflows(runtime, cfg, RUN, **kwargs))


def test_fixed_mode_identifiers_and_call_order() -> None:
    rt = FakeRuntime()
    cfg = WorkloadConfig(workflows=3, concurrency=2, cycles=2, loop="fixed")
    results = run(rt, cfg)
    assert len(rt.calls) == 3 * 2 * 4
    threads = rt.by_thread()
    assert sorted(threads) == [f"{RUN}-t000", f"{RUN}-t001", f"{RUN}-t002"]
    assert [w[1] for w in sorted(rt.workflows)] == sorted(threads)
    run_ids = {w[2] for w in rt.workflows}
    assert len(run_ids) == 3
    for thread_id, calls in threads.items():
        assert [c.ids.agent_id for c in calls] == ORDER * 2
        assert [c.ids.graph_node for c in calls] == ORDER * 2
        assert [c.ids.turn_id for c in calls] == [1] * 4 + [2] * 4
        assert [c.ids.previous_agent_id for c in calls] == [None, *ORDER, *ORDER[:3]]
        assert {c.ids.benchmark_run_id for c in calls} == {RUN}
        (workflow_run_id,) = {c.ids.workflow_run_id for c in calls}
        assert (RUN, thread_id, workflow_run_id) in rt.workflows
        uuid.UUID(workflow_run_id)
        for c in calls:
            assert c.prompt == PromptInfo(TEMPLATE_VERSION, "shared-first", "documents")
            assert c.max_tokens == cfg.max_tokens and c.ignore_eos is False
    assert [(r.thread_id, r.cycles, r.calls, r.ok, r.failed_agent) for r in results] == [
        (f"{RUN}-t{i:03d}", 2, 8, True, None) for i in range(3)
    ]
    assert {r.workflow_run_id for r in results} == run_ids


def test_prompts_carry_the_task_and_the_latest_state() -> None:
    rt = FakeRuntime()
    cfg = WorkloadConfig(workflows=1, concurrency=1, cycles=2, layout="role-first")
    (result,) = run(rt, cfg)
    tasks = load_tasks()
    problem = tasks.problem(result.task_id or "")
    planner1, _, expresser1, _, planner2 = rt.calls[:5]
    for doc in tasks.documents_for(problem):
        assert doc.text in planner1.messages[0]["content"]
    assert planner1.messages[0]["content"].startswith("Role: Planner")
    assert problem.question in planner1.messages[1]["content"]
    assert "first step" in planner1.messages[1]["content"]
    assert "Plan: CALC:" in expresser1.messages[1]["content"]
    assert "Review: Matches. VERDICT: DONE" in planner2.messages[1]["content"]
    assert "corrected plan" in planner2.messages[1]["content"]
    assert {c.prompt.layout for c in rt.calls} == {"role-first"}


def test_model_mode_stops_on_done() -> None:
    def reply(ids: CallIds) -> str:
        if ids.agent_id == "reviewer":
            return "Wrong unit. VERDICT: REVISE" if ids.turn_id == 1 else "Good. VERDICT: DONE"
        return default_reply(ids)

    rt = FakeRuntime(reply=reply)
    (result,) = run(rt, WorkloadConfig(workflows=1, loop="model", max_cycles=5))
    assert (result.cycles, result.calls, result.unparsed_verdicts, result.ok) == (2, 8, 0, True)
    assert [c.ids.turn_id for c in rt.calls] == [1] * 4 + [2] * 4


def test_model_mode_is_bounded_by_max_cycles() -> None:
    rt = FakeRuntime(reply=lambda ids: "VERDICT: REVISE" if ids.agent_id == "reviewer" else "x")
    (result,) = run(rt, WorkloadConfig(workflows=1, loop="model", max_cycles=5, cycles=1))
    assert (result.cycles, result.calls, result.unparsed_verdicts) == (5, 20, 0)


def test_unparseable_verdicts_are_counted_and_mean_revise() -> None:
    rt = FakeRuntime(reply=lambda ids: "I am not sure." if ids.agent_id == "reviewer" else "x")
    (result,) = run(rt, WorkloadConfig(workflows=1, loop="model", max_cycles=3))
    assert (result.cycles, result.calls, result.unparsed_verdicts, result.ok) == (3, 12, 3, True)


def test_fixed_mode_ignores_the_verdict() -> None:
    rt = FakeRuntime(reply=lambda ids: "??" if ids.agent_id == "reviewer" else "x")
    (result,) = run(rt, WorkloadConfig(workflows=1, loop="fixed", cycles=3, max_cycles=1))
    assert (result.cycles, result.calls, result.unparsed_verdicts) == (3, 12, 3)


def test_a_failed_call_ends_only_its_workflow() -> None:
    victim = f"{RUN}-t001"

    def fail(ids: CallIds) -> bool:
        return ids.thread_id == victim and ids.agent_id == "executor" and ids.turn_id == 2

    rt = FakeRuntime(fail=fail)
    results = run(rt, WorkloadConfig(workflows=3, concurrency=3, cycles=2))
    threads = rt.by_thread()
    assert [c.ids.agent_id for c in threads[victim]] == ORDER + ORDER[:2]
    assert [(r.ok, r.failed_agent, r.calls, r.cycles) for r in results] == [
        (True, None, 8, 2),
        (False, "executor", 6, 1),
        (True, None, 8, 2),
    ]


def test_a_failed_first_call_makes_one_call() -> None:
    rt = FakeRuntime(fail=lambda ids: ids.agent_id == "planner")
    (result,) = run(rt, WorkloadConfig(workflows=1))
    assert (result.ok, result.failed_agent, result.calls, result.cycles) == (
        False,
        "planner",
        1,
        0,
    )


@pytest.mark.parametrize("concurrency", [1, 3])
def test_concurrency_is_bounded(concurrency: int) -> None:
    rt = FakeRuntime(delay_s=0.002)
    results = run(rt, WorkloadConfig(workflows=7, concurrency=concurrency, cycles=1))
    assert rt.max_in_flight == concurrency
    assert len(results) == 7 and all(r.ok for r in results)


def test_executor_tools_run_in_tool_spans_and_report_tool_ms() -> None:
    rt = FakeRuntime()
    run(rt, WorkloadConfig(workflows=2, concurrency=2, cycles=2, tool=True))
    for call in rt.calls:
        if call.ids.agent_id == "executor":
            assert call.tools_before == ["lookup", "calculator"]
            assert call.tool_ms is not None and call.tool_ms > 0
            assert "calculator: 14.8815" in call.messages[1]["content"]
        else:
            assert call.tools_before == [] and call.tool_ms is None
    assert len(rt.tools) == 2 * 2 * 2
    for record in rt.tools:
        assert record.agent is not None and record.agent.agent_id == "executor"
        if record.name == "calculator":
            assert record.inputs == {
                "expression": "(2418.6 - 2105.3) / 2105.3 * 100",
                "source": "plan",
            }
            assert record.output == "calculator: 14.8815"
        else:
            assert record.name == "lookup" and isinstance(record.output, str)
            assert record.inputs["documents"]


def test_calculator_falls_back_to_the_tasks_formula() -> None:
    def no_calc(ids: CallIds) -> str:
        return "Look up revenue and compare." if ids.agent_id == "planner" else "VERDICT: DONE"

    rt = FakeRuntime(reply=no_calc)
    results = run(rt, WorkloadConfig(workflows=3, concurrency=1, cycles=1, tool=True))
    calcs = [t for t in rt.tools if t.name == "calculator"]
    assert len(calcs) == 3
    tasks = load_tasks()
    for record, result in zip(calcs, results, strict=True):
        problem = tasks.problem(result.task_id)
        assert record.inputs == {"expression": problem.expression, "source": "task"}
        assert record.output == calculate(problem.expression).text
        assert "error" not in record.output


def test_expresser_sees_the_calculator_value() -> None:
    rt = FakeRuntime()
    run(rt, WorkloadConfig(workflows=1, cycles=1))
    expresser = next(c for c in rt.calls if c.ids.agent_id == "expresser")
    assert "Execution result: calculator: 14.8815 | Revenue" in expresser.messages[1]["content"]


def test_no_tool_runs_when_disabled() -> None:
    rt = FakeRuntime()
    run(rt, WorkloadConfig(workflows=2, cycles=1, tool=False))
    assert rt.tools == []
    assert all(c.tool_ms is None for c in rt.calls)
    executor = next(c for c in rt.calls if c.ids.agent_id == "executor")
    assert "tools disabled" in executor.messages[1]["content"]


def test_tasks_are_assigned_round_robin_from_a_seeded_order() -> None:
    tasks = load_tasks()
    n = len(tasks.problems)
    order = assign_tasks(tasks, n + 2, seed=0)
    assert len({p.id for p in order[:n]}) == n
    assert order[n:] == order[:2]
    assert order == assign_tasks(tasks, n + 2, seed=0)
    assert order != assign_tasks(tasks, n + 2, seed=1)
    rt = FakeRuntime()
    results = run(rt, WorkloadConfig(workflows=3, cycles=1, seed=0))
    assert [r.task_id for r in results] == [p.id for p in order[:3]]


def test_callbacks_see_every_call_and_workflow() -> None:
    seen_calls: list[tuple[CallIds, LlmReply]] = []
    done: list[WorkflowResult] = []
    rt = FakeRuntime()
    results = run(
        rt,
        WorkloadConfig(workflows=3, concurrency=2, cycles=1),
        on_call=lambda ids, reply: seen_calls.append((ids, reply)),
        on_workflow_done=done.append,
    )
    assert [ids for ids, _ in seen_calls] == [c.ids for c in rt.calls]
    assert all(reply.status == STATUS_OK for _, reply in seen_calls)
    assert sorted(done, key=lambda r: r.thread_id) == results


def test_synthetic_mode_needs_a_tokenizer() -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        run(FakeRuntime(), WorkloadConfig(mode="synthetic"))


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="SmolLM2 tokenizer not downloaded")
def test_synthetic_mode_sends_exact_lengths_and_ignores_eos() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    lengths = SyntheticConfig(fixed_tokens=128, dynamic_tokens=16, output_tokens=24)
    cfg = WorkloadConfig(mode="synthetic", workflows=2, cycles=2, synthetic=lengths, tool=True)
    rt = FakeRuntime()
    results = run(rt, cfg, tokenizer=tok)
    assert len(rt.calls) == 16 and all(r.task_id is None and r.ok for r in results)
    assert rt.tools == []
    fixed: dict[str, set[str]] = {}
    for call in rt.calls:
        assert (call.max_tokens, call.ignore_eos, call.prompt.layout) == (24, True, "synthetic")
        system, user = (m["content"] for m in call.messages)
        assert len(tok.encode(system, add_special_tokens=False).ids) == 128
        assert len(tok.encode(user, add_special_tokens=False).ids) == 16
        fixed.setdefault(call.ids.agent_id, set()).add(system)
    assert all(len(prompts) == 1 for prompts in fixed.values()) and len(fixed) == 4
