"""Eviction hints (probe/hints.py): each call's engine priority from the workflow, and how it
reaches the engine (SGLang's `priority` body field; nothing for vLLM) and the row."""

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from test_engine_prompt_ids import Captured
from test_intercept import BASE, HI
from vllm_stub import Stub

from kvscope.config import EngineConfig, ExperimentConfig
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.hints import MAX_AGENTS, make_hints
from kvscope.probe.identity import CallIdentity
from kvscope.probe.intercept import Interceptor
from kvscope.probe.wire import CallContext

PEER = ["planner", "executor", "expresser", "reviewer"]


def call(agent: str, previous: str | None, workflow: str = "w1") -> CallIdentity:
    return CallIdentity(agent_id=agent, previous_agent_id=previous, workflow_run_id=workflow)


def cycles(n: int, workflow: str = "w1") -> Iterator[CallIdentity]:
    previous = None
    for _ in range(n):
        for agent in PEER:
            yield call(agent, previous, workflow)
            previous = agent


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_none_sends_nothing_and_an_unknown_policy_is_refused() -> None:
    assert make_hints(None) is None and make_hints("none") is None
    with pytest.raises(ValueError, match="unknown eviction hint policy"):
        make_hints("soonest")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["steps-to-execution", "predicted-next"])
def test_a_strict_cycle_ranks_the_agents_by_first_appearance(policy: str) -> None:
    hints = make_hints(policy)  # type: ignore[arg-type]
    assert hints is not None
    got = [hints(c) for c in cycles(3)]
    assert all(p >= 2 and p % 2 == 0 for p in got)  # even: a finished prompt's +1 stays inside
    later = got[4:8]  # once the cycle is known: every agent equally far, so first seen first
    assert later == sorted(later, reverse=True) and len(set(later)) == 4
    assert got[8:12] == later  # stable from then on (SGLang keeps a node's highest level)


def test_steps_to_execution_puts_the_agent_next_for_another_workflow_first() -> None:
    hints = make_hints("steps-to-execution")
    assert hints is not None
    for c in cycles(2, "w0"):  # the graph learned: planner -> executor -> ... -> planner
        hints(c)
    hints(call("planner", None, "w2"))  # w2 is at the planner: the executor is one step away
    executor = hints(call("executor", "reviewer", "w1"))  # w1's own return: four steps
    expresser = hints(call("expresser", "reviewer", "w3"))  # two steps from w2's planner
    reviewer = hints(call("reviewer", "reviewer", "w4"))  # three
    assert executor > expresser > reviewer


def test_predicted_next_follows_the_learned_transitions_and_fan_out() -> None:
    hints = make_hints("predicted-next")
    assert hints is not None
    # a supervisor that sends to the researcher three times out of four, the writer once
    for i, worker in enumerate(["researcher", "researcher", "writer", "researcher"]):
        hints(call("supervisor", None, f"w{i}"))
        hints(call(worker, "supervisor", f"w{i}"))
    hints(call("supervisor", None, "live"))  # a workflow at the supervisor now
    researcher = hints(call("researcher", "supervisor", "a"))
    writer = hints(call("writer", "supervisor", "b"))
    # the researcher (p = 3/4) outranks the writer (p = 1/4) whatever their order of appearance
    assert researcher - writer >= 2 * MAX_AGENTS


def test_an_idle_workflow_stops_counting() -> None:
    clock = Clock()
    hints = make_hints("steps-to-execution", idle_s=10, clock=clock)
    assert hints is not None
    for c in cycles(2, "w0"):
        hints(c)
    hints(call("planner", None, "w2"))
    soon = hints(call("executor", "reviewer", "w1"))  # w2's planner: one step
    clock.now = 60  # w2 made no call since: no longer in flight
    hints(call("planner", None, "w5"))  # w5 is at the planner now...
    clock.now = 120
    late = hints(call("executor", "reviewer", "w1"))  # ...but idle too: four steps, own cycle
    assert soon > late


def post(ctx: CallContext, payload: dict[str, Any], engine: Any) -> dict[str, Any]:
    stub = Stub()  # what is sent is checked; the replies are vLLM's
    with httpx2.Client(transport=stub.transport(httpx2)) as client, Interceptor(engine, BASE, ctx):
        client.post(BASE + "/v1/chat/completions", json=payload)
    return stub.received[-1][1]


def test_sglang_calls_carry_the_priority_and_the_row_keeps_it() -> None:
    rows = Captured()
    hints = make_hints("steps-to-execution")
    ctx = CallContext("b", "e", "h", "langgraph", 1, "smollm2", None, rows.append, hints=hints)
    engine = SglangEngine(EngineConfig(kind="sglang"))
    sent = post(ctx, {"model": "m", "messages": HI}, engine)
    assert isinstance(sent["priority"], int) and sent["priority"] >= 2
    assert rows[-1].engine_priority == sent["priority"]
    own = post(ctx, {"model": "m", "messages": HI, "priority": 7}, engine)
    assert own["priority"] == 7 and rows[-1].engine_priority == 7  # the app's own wins


def test_vllm_gets_no_priority_and_the_row_says_none() -> None:
    rows = Captured()
    ctx = CallContext("b", "e", "h", "langgraph", 1, "smollm2", None, rows.append,
                      hints=make_hints("predicted-next"))  # fmt: skip
    sent = post(ctx, {"model": "m", "messages": HI}, VllmEngine(EngineConfig()))
    assert "priority" not in sent and rows[-1].engine_priority is None


def test_hints_are_refused_on_vllm_and_left_out_of_the_config_when_unset() -> None:
    with pytest.raises(ValueError, match="no such lever"):
        ExperimentConfig(engine=EngineConfig(), eviction_hints="steps-to-execution")
    cfg = ExperimentConfig(engine=EngineConfig(kind="sglang"), eviction_hints="predicted-next")
    assert cfg.eviction_hints == "predicted-next"
    from kvscope.config import as_dict

    assert "eviction_hints" not in as_dict(ExperimentConfig())  # recorded configs keep their hash
