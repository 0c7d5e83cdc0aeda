"""The dynamic workloads against the scripted engine (tests/peer_engine.py): dynamic PEER's
Reviewer and the supervisor route by structured output, within max_steps calls."""

import asyncio
import json
from typing import Any

import pytest
from peer_engine import BASE, Call, ScriptedEngine, default_reply

from kvscope.config import WorkloadConfig
from kvscope.workload import decisions
from kvscope.workload.driver import WorkflowResult, run_workflows
from kvscope.workload.peer import dynamic_route
from kvscope.workload.supervisor_prompts import TEMPLATE_VERSION, WORKERS
from kvscope.workload.taskset import load_tasks

RUN = "dyn-test"
PEX = ["planner", "executor", "expresser", "reviewer"]


def run(engine: ScriptedEngine, cfg: WorkloadConfig) -> list[WorkflowResult]:
    return asyncio.run(
        run_workflows(BASE, "smollm2", cfg, thread_prefix=RUN, client=engine.client())
    )


def dynamic(**kw: Any) -> WorkloadConfig:
    return WorkloadConfig(**{"workflows": 1, "loop": "dynamic", "max_steps": 12, **kw})


def test_choice_format_and_parse() -> None:
    fmt = decisions.choice_format(["planner", "end"])
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["schema"] == {"type": "string", "enum": ["planner", "end"]}
    assert decisions.parse_choice('"end"', ["planner", "end"]) == "end"
    assert decisions.parse_choice(" planner\n", ["planner", "end"]) == "planner"
    assert decisions.parse_choice('"executor"', ["planner", "end"]) is None
    assert decisions.parse_choice('{"next": "end"}', ["planner", "end"]) is None
    assert decisions.parse_choice(None, ["end"]) is None
    with pytest.raises(ValueError):
        decisions.choice_format([])


def test_dynamic_route_respects_max_steps() -> None:
    assert dynamic_route("planner", 4, 8) == "planner"
    assert dynamic_route("planner", 5, 8) == "end"
    assert dynamic_route("executor", 5, 8) == "executor"
    assert dynamic_route("executor", 6, 8) == "end"
    assert dynamic_route("end", 4, 20) == "end"
    assert dynamic_route(None, 4, 20) == "end"


def test_dynamic_peer_follows_the_reviewers_choice() -> None:
    script = {1: "executor", 2: "planner", 3: "end"}

    def reply(call: Call) -> str:
        if call.agent == "reviewer":
            assert call.choices == ["planner", "executor", "end"]
            assert call.body["max_tokens"] == decisions.ROUTE_MAX_TOKENS
            assert call.messages[-1]["content"].endswith(decisions.REVIEWER_ROUTE)
            return json.dumps(script[call.turn])
        assert call.choices is None and "response_format" not in call.body
        return default_reply(call)

    engine = ScriptedEngine(reply=reply)
    (result,) = run(engine, dynamic(max_steps=20))
    expected = PEX + PEX[1:] + PEX
    assert [c.agent for c in engine.calls] == expected
    assert list(result.path) == expected
    assert (result.calls, result.cycles, result.unparsed_verdicts, result.ok) == (11, 3, 0, True)


def test_dynamic_peer_is_bounded_by_max_steps() -> None:
    engine = ScriptedEngine()  # the Reviewer always chooses planner (the first choice)
    (result,) = run(engine, dynamic(max_steps=10))
    assert list(result.path) == PEX * 2  # a third round (4 calls) would make 12 > 10
    engine = ScriptedEngine(reply=lambda c: '"executor"' if c.choices else "x")
    (result,) = run(engine, dynamic(max_steps=10))
    assert list(result.path) == PEX + PEX[1:] * 2  # 4 + 3 + 3 = 10
    assert result.unparsed_verdicts == 0


def test_dynamic_peer_counts_an_unparsed_choice_and_ends() -> None:
    engine = ScriptedEngine(reply=lambda c: "maybe" if c.choices else "x")
    (result,) = run(engine, dynamic())
    assert (list(result.path), result.unparsed_verdicts, result.ok) == (PEX, 1, True)


def supervisor(**kw: Any) -> WorkloadConfig:
    return WorkloadConfig(**{"workflow": "supervisor", "workflows": 1, "max_steps": 20, **kw})


def fanout_size(task_id: str | None) -> int:
    return 2 * len(load_tasks().problem(task_id or "").document_ids)


@pytest.mark.parametrize("workers", [3, 4, 6])
def test_supervisor_routes_through_its_workers(workers: int) -> None:
    engine = ScriptedEngine()  # the supervisor picks the first worker not yet done
    (result,) = run(engine, supervisor(workers=workers))
    k = fanout_size(result.task_id)
    team = list(WORKERS[:workers])
    expected = ["supervisor", *["researcher"] * k]
    for worker in team[1:]:
        expected += ["supervisor", worker]
    expected += ["supervisor"]
    assert list(result.path) == expected
    assert [c.agent for c in engine.calls if c.agent != "researcher"] == [
        a for a in expected if a != "researcher"
    ]
    decisions = [c for c in engine.calls if c.agent == "supervisor"]
    # each decision offers the workers that have not worked yet, and finish
    assert [len(c.choices or []) for c in decisions] == list(range(workers + 1, 0, -1))
    assert all(c.choices and c.choices[-1] == "finish" for c in decisions)
    assert (result.cycles, result.unparsed_verdicts, result.ok) == (workers + 1, 0, True)
    assert {c.meta["prompt_template_version"] for c in engine.calls} == {TEMPLATE_VERSION}


def test_supervisor_fanout_runs_in_parallel_and_joins() -> None:
    engine = ScriptedEngine(delay_s=0.02)
    (result,) = run(engine, supervisor(workers=3))
    branches = [c for c in engine.calls if c.agent == "researcher"]
    assert len(branches) == fanout_size(result.task_id) >= 2
    focuses = {c.messages[-1]["content"].split("quote ")[-1] for c in branches}
    assert len(focuses) == 2
    analyst = next(c for c in engine.calls if c.agent == "analyst")
    notes = analyst.messages[-1]["content"]
    assert notes.count("researcher output") == len(branches)  # the join kept every branch
    assert "Calculator:" in notes
    # all agents' system messages share the preamble + documents prefix
    systems = {c.agent: c.messages[0]["content"] for c in engine.calls}
    first = systems["supervisor"]
    shared = first[: first.index("Role:")]
    assert all(s.startswith(shared) for s in systems.values())


def test_supervisor_finish_and_step_bound() -> None:
    engine = ScriptedEngine(reply=lambda c: '"finish"' if c.choices else "x")
    (result,) = run(engine, supervisor())
    assert list(result.path) == ["supervisor"]
    engine = ScriptedEngine()
    (result,) = run(engine, supervisor(workers=6, max_steps=6))
    assert result.calls <= 6
    assert result.path[-1] == "supervisor" and result.unparsed_verdicts == 0


def test_supervisor_failed_branch_ends_the_workflow() -> None:
    engine = ScriptedEngine(fail=lambda c: c.agent == "researcher")
    (result,) = run(engine, supervisor())
    assert (result.ok, result.failed_agent) == (False, "researcher")
    assert "analyst" not in result.path


def test_supervisor_config_checks() -> None:
    with pytest.raises(ValueError):
        WorkloadConfig(workflow="supervisor", workers=7)
    with pytest.raises(ValueError):
        WorkloadConfig(workflow="supervisor", mode="synthetic")
    with pytest.raises(ValueError):
        WorkloadConfig(workflow="supervisor", sharing="branch")


def test_mlflow_params_name_each_workload() -> None:
    from kvscope.config import ExperimentConfig
    from kvscope.probe.params import mlflow_params

    env = {"engine": {"launch_command": "x"}}
    sup = ExperimentConfig(workload=supervisor(workers=3, max_steps=9))
    p = mlflow_params(sup, "m", None, {}, env)
    assert p["workflow"] == "supervisor-researcher-analyst-writer"
    assert (p["workflow_kind"], p["workers"], p["max_steps"]) == ("supervisor", 3, 9)
    assert p["prompt_template_version"] == TEMPLATE_VERSION and "loop_mode" not in p
    dyn = mlflow_params(ExperimentConfig(workload=dynamic(max_steps=10)), "m", None, {}, env)
    assert dyn["workflow"] == "planner-executor-expresser-reviewer"
    assert (dyn["loop_mode"], dyn["max_steps"]) == ("dynamic", 10)
    assert "workers" not in dyn and "cycles" not in dyn and "max_cycles" not in dyn
    fixed = mlflow_params(ExperimentConfig(), "m", None, {}, env)
    assert (fixed["loop_mode"], fixed["cycles"]) == ("fixed", 2) and "max_steps" not in fixed
