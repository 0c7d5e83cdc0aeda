"""A graph invocation that raised: the RunTracker hands its root's error to `on_error` (for
invocations.jsonl, so that the trace's root is ERROR), keyed by the workflow_run_id its calls'
rows carry; invocations that returned, were interrupted, or made no LLM call have none."""

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import START, StateGraph
from langgraph.types import interrupt
from test_identity import Engine, llm, profiled

from kvscope.probe import run_tracker
from kvscope.records.base import JsonlWriter
from kvscope.records.invocations import (
    ERROR_TEXT_LIMIT,
    INVOCATIONS_JSONL,
    InvocationError,
    error_text,
    load_invocation_errors,
)
from kvscope.records.requests import RequestRecord


class S(TypedDict):
    n: int


@pytest.fixture
def errors() -> Iterator[list[InvocationError]]:
    """The errors the tracker reports while the test's Interceptor is active (the first
    activation's sinks are the tracker's)."""
    got: list[InvocationError] = []
    run_tracker.activate(on_error=got.append)
    try:
        yield got
    finally:
        run_tracker.deactivate()


def two_nodes(engine: Engine, fail: bool) -> object:
    model = llm(engine)

    def second(s: S) -> dict:
        model.invoke("b")
        if fail:
            raise ValueError("the writer broke")
        return {}

    g = StateGraph(S)
    g.add_node("first", lambda s: (model.invoke("a"), {})[1])
    g.add_node("second", second)
    g.add_edge(START, "first")
    g.add_edge("first", "second")
    return g.compile()


def test_a_graph_that_raised_after_its_calls(errors: list[InvocationError]) -> None:
    rows: list[RequestRecord] = []
    with profiled(rows):
        two_nodes(Engine(), fail=False).invoke({"n": 0})  # returned: nothing to report
        with pytest.raises(ValueError):
            two_nodes(Engine(), fail=True).invoke({"n": 0})
    assert [r.status for r in rows] == ["ok"] * 4  # every call succeeded
    [error] = errors
    assert error.workflow_run_id == rows[2].workflow_run_id == rows[3].workflow_run_id
    assert (error.error_type, error.error_message) == ("ValueError", "the writer broke")
    assert error.description == "ValueError: the writer broke"
    assert error.end_ns >= rows[3].end_ns


def test_an_entrypoint_that_raised_async(errors: list[InvocationError]) -> None:
    engine = Engine()
    model = llm(engine)

    @task
    def researcher(topic: str) -> str:
        return str(model.invoke(topic).content)

    @entrypoint()
    async def workflow(question: str) -> str:
        await researcher(question)
        raise KeyError("no writer")

    rows: list[RequestRecord] = []
    with profiled(rows), pytest.raises(KeyError):
        asyncio.run(workflow.ainvoke("q"))
    [row] = rows
    [error] = errors
    assert (error.workflow_run_id, error.error_type) == (row.workflow_run_id, "KeyError")
    assert error.error_message == "'no writer'"


def test_no_error_without_a_call_nor_for_an_interrupt(errors: list[InvocationError]) -> None:
    engine = Engine()
    model = llm(engine)

    def broken(s: S) -> dict:
        raise RuntimeError("before any call")

    g = StateGraph(S)
    g.add_node("broken", broken)
    g.add_edge(START, "broken")

    def ask(s: S) -> dict:
        model.invoke("a")
        interrupt("approve?")  # pauses the run: not a failure
        return {}

    h = StateGraph(S)
    h.add_node("ask", ask)
    h.add_edge(START, "ask")
    paused = h.compile(checkpointer=InMemorySaver())
    rows: list[RequestRecord] = []
    with profiled(rows):
        with pytest.raises(RuntimeError):
            g.compile().invoke({"n": 0})  # no call: no trace, nothing to mark
        out = paused.invoke({"n": 0}, {"configurable": {"thread_id": "t"}})
    assert "__interrupt__" in out and len(rows) == 1
    assert errors == []


def test_the_stream_round_trip(tmp_path: Path) -> None:
    long = "x" * (ERROR_TEXT_LIMIT + 10)
    kept = [
        InvocationError("wf-1", "ValueError", "boom", 10),
        InvocationError("wf-2", "CancelledError", error_text(RuntimeError(long)), 20),
    ]
    writer: JsonlWriter[InvocationError] = JsonlWriter(tmp_path / INVOCATIONS_JSONL)
    for e in kept:
        writer.append(e)
    writer.close()
    assert load_invocation_errors(tmp_path) == {"wf-1": kept[0], "wf-2": kept[1]}
    assert kept[1].error_message.endswith("...[cut]")
    assert len(kept[1].error_message) < ERROR_TEXT_LIMIT + 10
    assert InvocationError("w", "CancelledError", "", 1).description == "CancelledError"
    assert load_invocation_errors(tmp_path / "none") == {}
