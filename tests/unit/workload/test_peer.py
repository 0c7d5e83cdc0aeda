"""The PEER app as an app: its graph against a scripted engine (tests/peer_engine.py), then the
same run profiled by an Interceptor, whose rows must name every call from LangGraph alone."""

import asyncio
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from peer_engine import BASE, Call, ScriptedEngine, default_reply

from kvscope.config import EngineConfig, SyntheticConfig, WorkloadConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import ConfigError
from kvscope.probe.intercept import Interceptor
from kvscope.probe.wire import CallContext
from kvscope.records.requests import RequestRecord
from kvscope.records.tools import ToolCall
from kvscope.workload.driver import WorkflowResult, assign_tasks, run_workflows
from kvscope.workload.prompts import TEMPLATE_VERSION
from kvscope.workload.synthetic import SYNTHETIC_LAYOUT, SYNTHETIC_TEMPLATE_VERSION
from kvscope.workload.taskset import load_tasks
from kvscope.workload.tools import calculate

TOKENIZER = Path.home() / ".cache/kvscope/models/SmolLM2-135M-Instruct/tokenizer.json"
RUN = "bench-test"
ORDER = ["planner", "executor", "expresser", "reviewer"]


def run(engine: ScriptedEngine, cfg: WorkloadConfig, **kwargs: Any) -> list[WorkflowResult]:
    client = engine.client()
    return asyncio.run(
        run_workflows(BASE, "smollm2", cfg, thread_prefix=RUN, client=client, **kwargs)
    )


def test_fixed_mode_call_order_and_requests() -> None:
    engine = ScriptedEngine()
    cfg = WorkloadConfig(workflows=3, concurrency=2, cycles=2, loop="fixed")
    results = run(engine, cfg)
    threads = engine.by_thread()
    assert sorted(threads) == [f"{RUN}-t000", f"{RUN}-t001", f"{RUN}-t002"]
    for calls in threads.values():
        assert [c.agent for c in calls] == ORDER * 2
        assert [c.turn for c in calls] == [1] * 4 + [2] * 4
        for c in calls:
            body = {k: c.body[k] for k in ("model", "max_tokens", "temperature", "stream")}
            assert body == {"model": "smollm2", "max_tokens": 32, "temperature": 0, "stream": True}
            assert c.body["stream_options"] == {"include_usage": True}
            assert "ignore_eos" not in c.body
            assert c.meta == {
                "prompt_template_version": TEMPLATE_VERSION,
                "layout": "shared-first",
                "sharing": "documents",
                "fixed_messages": 1,
            }
    assert [(r.thread_id, r.cycles, r.calls, r.ok, r.failed_agent) for r in results] == [
        (f"{RUN}-t{i:03d}", 2, 8, True, None) for i in range(3)
    ]
    assert len({uuid.UUID(r.workflow_run_id) for r in results}) == 3


def test_prompts_carry_the_task_and_the_latest_state() -> None:
    engine = ScriptedEngine()
    cfg = WorkloadConfig(workflows=1, concurrency=1, cycles=2, layout="role-first")
    (result,) = run(engine, cfg)
    tasks = load_tasks()
    problem = tasks.problem(result.task_id or "")
    planner1, _, expresser1, _, planner2 = (c.messages for c in engine.calls[:5])
    for doc in tasks.documents_for(problem):
        assert doc.text in planner1[0]["content"]
    assert planner1[0]["content"].startswith("Role: Planner")
    assert problem.question in planner1[1]["content"]
    assert "first step" in planner1[1]["content"]
    assert "Plan: CALC:" in expresser1[1]["content"]
    assert "Review: Matches. VERDICT: DONE" in planner2[1]["content"]
    assert "corrected plan" in planner2[1]["content"]
    assert {c.meta["layout"] for c in engine.calls} == {"role-first"}


def test_model_mode_stops_on_done() -> None:
    def reply(call: Call) -> str:
        if call.agent == "reviewer":
            return "Wrong unit. VERDICT: REVISE" if call.turn == 1 else "Good. VERDICT: DONE"
        return default_reply(call)

    engine = ScriptedEngine(reply=reply)
    (result,) = run(engine, WorkloadConfig(workflows=1, loop="model", max_cycles=5))
    assert (result.cycles, result.calls, result.unparsed_verdicts, result.ok) == (2, 8, 0, True)


def test_model_mode_is_bounded_by_max_cycles() -> None:
    engine = ScriptedEngine(reply=lambda c: "VERDICT: REVISE" if c.agent == "reviewer" else "x")
    (result,) = run(engine, WorkloadConfig(workflows=1, loop="model", max_cycles=5, cycles=1))
    assert (result.cycles, result.calls, result.unparsed_verdicts) == (5, 20, 0)


def test_unparseable_verdicts_are_counted_and_mean_revise() -> None:
    engine = ScriptedEngine(reply=lambda c: "Not sure." if c.agent == "reviewer" else "x")
    (result,) = run(engine, WorkloadConfig(workflows=1, loop="model", max_cycles=3))
    assert (result.cycles, result.calls, result.unparsed_verdicts, result.ok) == (3, 12, 3, True)


def test_fixed_mode_ignores_the_verdict() -> None:
    engine = ScriptedEngine(reply=lambda c: "??" if c.agent == "reviewer" else "x")
    (result,) = run(engine, WorkloadConfig(workflows=1, loop="fixed", cycles=3, max_cycles=1))
    assert (result.cycles, result.calls, result.unparsed_verdicts) == (3, 12, 3)


VICTIM = f"{RUN}-t001"


def fails_victim(call: Call) -> bool:
    return call.thread_id == VICTIM and call.agent == "executor" and call.turn == 2


def test_a_failed_call_ends_only_its_workflow() -> None:
    engine = ScriptedEngine(fail=fails_victim)
    results = run(engine, WorkloadConfig(workflows=3, concurrency=3, cycles=2))
    assert [c.agent for c in engine.by_thread()[VICTIM]] == ORDER + ORDER[:2]
    assert [(r.ok, r.failed_agent, r.calls, r.cycles) for r in results] == [
        (True, None, 8, 2),
        (False, "executor", 6, 1),
        (True, None, 8, 2),
    ]


def test_a_failed_first_call_makes_one_call() -> None:
    engine = ScriptedEngine(fail=lambda c: c.agent == "planner")
    (result,) = run(engine, WorkloadConfig(workflows=1))
    assert (result.ok, result.failed_agent, result.calls, result.cycles) == (False, "planner", 1, 0)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_concurrency_is_bounded(concurrency: int) -> None:
    engine = ScriptedEngine(delay_s=0.005)
    results = run(engine, WorkloadConfig(workflows=7, concurrency=concurrency, cycles=1))
    assert engine.max_threads_in_flight() == concurrency
    assert len(results) == 7 and all(r.ok for r in results)


def test_the_executor_sees_its_tool_results_and_the_expresser_the_value() -> None:
    engine = ScriptedEngine()
    run(engine, WorkloadConfig(workflows=1, cycles=1, tool=True))
    executor, expresser = engine.calls[1], engine.calls[2]
    assert "Tool results: calculator: 14.8815" in executor.messages[1]["content"]
    assert "Execution result: calculator: 14.8815 | Revenue" in expresser.messages[1]["content"]


def test_calculator_falls_back_to_the_tasks_formula() -> None:
    def no_calc(call: Call) -> str:
        return "Look up revenue and compare." if call.agent == "planner" else "VERDICT: DONE"

    engine = ScriptedEngine(reply=no_calc)
    results = run(engine, WorkloadConfig(workflows=3, concurrency=1, cycles=1, tool=True))
    tasks = load_tasks()
    executors = [c for c in engine.calls if c.agent == "executor"]
    for call, result in zip(executors, results, strict=True):
        value = calculate(tasks.problem(result.task_id or "").expression).text
        assert "error" not in value
        assert f"Tool results: {value}" in call.messages[1]["content"]


def test_no_tool_runs_when_disabled() -> None:
    engine = ScriptedEngine()
    run(engine, WorkloadConfig(workflows=1, cycles=1, tool=False))
    executor = next(c for c in engine.calls if c.agent == "executor")
    assert "tools disabled" in executor.messages[1]["content"]


def test_tasks_are_assigned_round_robin_from_a_seeded_order() -> None:
    tasks = load_tasks()
    n = len(tasks.problems)
    order = assign_tasks(tasks, n + 2, seed=0)
    assert len({p.id for p in order[:n]}) == n
    assert order[n:] == order[:2]
    assert order == assign_tasks(tasks, n + 2, seed=0)
    assert order != assign_tasks(tasks, n + 2, seed=1)
    results = run(ScriptedEngine(), WorkloadConfig(workflows=3, cycles=1, seed=0))
    assert [r.task_id for r in results] == [p.id for p in order[:3]]


def test_on_workflow_done_sees_every_workflow() -> None:
    done: list[WorkflowResult] = []
    cfg = WorkloadConfig(workflows=3, concurrency=2, cycles=1)
    results = run(ScriptedEngine(), cfg, on_workflow_done=done.append)
    assert sorted(done, key=lambda r: r.thread_id) == results


def test_synthetic_mode_needs_a_tokenizer() -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        run(ScriptedEngine(), WorkloadConfig(mode="synthetic"))


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="SmolLM2 tokenizer not downloaded")
def test_synthetic_mode_sends_exact_lengths_and_ignores_eos() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    lengths = SyntheticConfig(fixed_tokens=128, dynamic_tokens=16, output_tokens=24)
    cfg = WorkloadConfig(mode="synthetic", workflows=2, cycles=2, synthetic=lengths, tool=True)
    engine = ScriptedEngine()
    results = run(engine, cfg, tokenizer=tok)
    assert len(engine.calls) == 16 and all(r.task_id is None and r.ok for r in results)
    fixed: dict[str, set[str]] = {}
    for call in engine.calls:
        assert (call.body["max_tokens"], call.body["ignore_eos"]) == (24, True)
        assert call.meta == {
            "prompt_template_version": SYNTHETIC_TEMPLATE_VERSION,
            "layout": SYNTHETIC_LAYOUT,
            "fixed_messages": 1,
        }
        system, user = (m["content"] for m in call.messages)
        assert len(tok.encode(system, add_special_tokens=False).ids) == 128
        assert len(tok.encode(user, add_special_tokens=False).ids) == 16
        fixed.setdefault(call.agent, set()).add(system)
    assert all(len(prompts) == 1 for prompts in fixed.values()) and len(fixed) == 4


# --- profiled: the rows an Interceptor writes for the app's calls -------------------------


class Profile:
    """An Interceptor for BASE whose rows, tool runs and prompt hints are kept."""

    def __init__(self) -> None:
        self.rows: list[RequestRecord] = []
        self.tools: list[ToolCall] = []
        self.hints: list[Mapping[str, Any]] = []
        ctx = CallContext(
            "bench", "exp", "hash", "peer", 2, "smollm2", None, self.rows.append, self.instrument
        )
        self.interceptor = Interceptor(
            VllmEngine(EngineConfig()), f"{BASE}/v1", ctx, on_tool=self.tools.append
        )

    def instrument(
        self, body: Any, uuid_: str, hints: Any, reply: Any, n: Any, engine_ids: Any = None
    ) -> dict[str, Any]:
        self.hints.append(dict(hints))
        return {}

    def run(self, engine: ScriptedEngine, cfg: WorkloadConfig) -> list[WorkflowResult]:
        with self.interceptor:
            return run(engine, cfg)

    def by_thread(self) -> dict[str | None, list[RequestRecord]]:
        out: dict[str | None, list[RequestRecord]] = {}
        for row in sorted(self.rows, key=lambda r: r.start_ns or 0):
            out.setdefault(row.thread_id, []).append(row)
        return out


def test_profiled_rows_are_named_from_langgraph() -> None:
    profile, engine = Profile(), ScriptedEngine()
    results = profile.run(engine, WorkloadConfig(workflows=3, concurrency=2, cycles=2, tool=True))
    threads = profile.by_thread()
    assert sorted(threads) == [r.thread_id for r in results]
    for result in results:
        rows = threads[result.thread_id]
        assert [r.agent_id for r in rows] == ORDER * 2
        assert [r.graph_node for r in rows] == ORDER * 2
        assert [r.turn_id for r in rows] == [1] * 4 + [2] * 4
        assert [r.previous_agent_id for r in rows] == [None, *ORDER, *ORDER[:3]]
        assert {r.workflow_run_id for r in rows} == {result.workflow_run_id}
        for row in rows:
            assert (row.status, row.prompt_tokens, row.cached_tokens) == ("ok", 100, 64)
            assert (row.prompt_template_version, row.prompt_layout, row.sharing_mode) == (
                TEMPLATE_VERSION,
                "shared-first",
                "documents",
            )
            if row.agent_id == "executor":
                assert row.tool_ms is not None and row.tool_ms > 0
            else:
                assert row.tool_ms is None
    assert profile.hints == [{"fixed_messages": 1}] * 24
    # each call's tag is its row's id (rows are written as calls end: in-flight calls of two
    # workflows may end in another order than they started)
    sent = [c.body["request_id"] for c in engine.calls]
    assert len(sent) == len(set(sent)) and set(sent) == {r.request_uuid for r in profile.rows}
    assert sorted({(t.name, t.graph_node) for t in profile.tools}) == [
        ("calculator", "executor"),
        ("lookup", "executor"),
    ]
    assert len(profile.tools) == 3 * 2 * 2
    assert {t.workflow_run_id for t in profile.tools} == {r.workflow_run_id for r in results}


def test_profiled_failed_call_is_a_row_and_ends_only_its_workflow() -> None:
    profile = Profile()
    results = profile.run(
        ScriptedEngine(fail=fails_victim), WorkloadConfig(workflows=3, concurrency=3, cycles=2)
    )
    assert [r.ok for r in results] == [True, False, True]
    threads = profile.by_thread()
    assert [len(threads[r.thread_id]) for r in results] == [8, 6, 8]
    last = threads[VICTIM][-1]
    assert (last.agent_id, last.turn_id, last.status, last.error_type) == (
        "executor",
        2,
        "error",
        "http_500",
    )
    assert [r.status for r in profile.rows].count("ok") == 21


def test_the_app_imports_nothing_of_the_profiler() -> None:
    """peer.py and driver.py are the app: kvscope's config and its own workload modules only."""
    import ast

    from helpers import ROOT

    allowed = ("kvscope.config", "kvscope.errors", "kvscope.workload")
    for name in ("peer.py", "driver.py"):
        tree = ast.parse((ROOT / "src/kvscope/workload" / name).read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        kvscope = [m for m in imported if m.startswith("kvscope")]
        assert kvscope and all(m.startswith(allowed) for m in kvscope), (name, kvscope)
