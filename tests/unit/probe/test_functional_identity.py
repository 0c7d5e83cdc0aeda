"""Agent identity in LangGraph's Functional API (`@entrypoint` / `@task`), through the whole
path: the tasks call the stand-in vLLM with ChatOpenAI, the interception names each call's row.
A `@task` that calls the model is the agent, the entrypoint is the workflow; tasks launched
together are parallel branches; traces get an AGENT span per task visit.

The stand-in answers after 100 ms, as an engine does (the wait releases the GIL and the event
loop): tasks launched together are then all running before the first one ends, even on a
loaded machine (at 20 ms, 2 runs in 10 named a third parallel call the first one's successor
while the box ran an engine beside them)."""

import asyncio
import time
import warnings
from typing import Any, TypedDict

import httpx2
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import START, StateGraph
from test_identity import BASE, Engine, llm, profiled

from kvscope.records.requests import RequestRecord
from kvscope.traces import plan_traces


class Slow(Engine):
    """The stand-in vLLM, answering each request after `latency_s`."""

    latency_s = 0.1

    def transport(self, lib: Any, asynchronous: bool = False) -> Any:
        inner = super().transport(lib, asynchronous).handler
        if not asynchronous:

            def handle(request: Any) -> Any:
                time.sleep(self.latency_s)
                return inner(request)

            return lib.MockTransport(handle)

        async def ahandle(request: Any) -> Any:
            await asyncio.sleep(self.latency_s)
            return inner(request)

        return lib.MockTransport(ahandle)


@pytest.fixture
def engine() -> Engine:
    return Slow()


@pytest.fixture
def rows() -> list[RequestRecord]:
    return []


def who(rows: list[RequestRecord]) -> list[tuple[str | None, int | None, str | None]]:
    return [(r.agent_id, r.turn_id, r.previous_agent_id) for r in rows]


def test_tasks_are_the_agents_gathered_ones_parallel(engine: Engine, rows: list) -> None:
    """The issue's app: three researchers launched together, a writer after them, then a
    researcher again; the entrypoint plans first in its own code."""
    model = llm(engine)

    @task
    def researcher(topic: str) -> str:
        return str(model.invoke(f"research {topic}").content)

    @task
    def writer(notes: list[str]) -> str:
        return str(model.invoke("write " + " ".join(notes)).content)

    @entrypoint(checkpointer=InMemorySaver())
    def workflow(question: str) -> str:
        model.invoke(f"plan {question}")
        futures = [researcher(t) for t in ("a", "b", "c")]
        notes = [f.result() for f in futures]
        draft = writer(notes).result()
        researcher("check").result()
        return draft

    with profiled(rows):
        workflow.invoke("q", {"configurable": {"thread_id": "t-1"}})
    assert len(rows) == 6 and all(r.status == "ok" for r in rows)
    assert who(rows[:1]) == [("workflow", 1, None)]  # the entrypoint's own code
    assert sorted(who(rows[1:4])) == [("researcher", 1, "workflow")] * 3  # not each other
    assert who(rows[4:]) == [("writer", 1, "researcher"), ("researcher", 2, "writer")]
    assert [r.graph_node for r in rows] == ["workflow"] + ["workflow/researcher"] * 3 + [
        "workflow/writer",
        "workflow/researcher",
    ]
    assert len({r.workflow_run_id for r in rows}) == 1 and rows[0].workflow_run_id is not None
    assert {r.thread_id for r in rows} == {"t-1"}
    sent = [body for _, body, _ in engine.received]
    # each row carries the id its call was sent with (rows come as calls end: parallel ones in
    # any order)
    assert sorted(b["request_id"] for b in sent) == sorted(r.request_uuid for r in rows)

    [trace] = plan_traces([r.to_dict() for r in rows], [], {})
    visits = [(s.name, s.span_type, len(s.children)) for s in trace.root.children]
    assert visits == [
        ("workflow", "AGENT", 1),
        ("researcher", "AGENT", 3),  # one visit: the three launched together
        ("writer", "AGENT", 1),
        ("researcher", "AGENT", 1),
    ]
    assert trace.root.children[3].attributes["agent.turn_id"] == 2
    assert trace.root.children[3].attributes["agent.previous_id"] == "writer"


def test_async_tasks_gathered_and_a_model_loop(engine: Engine, rows: list) -> None:
    """The Functional API's agent loop (a `call_model` task called until done) beside tasks
    gathered with asyncio, in two concurrent invocations."""
    http = httpx2.AsyncClient(transport=engine.transport(httpx2, asynchronous=True))
    model = ChatOpenAI(model="m", base_url=f"{BASE}/v1", api_key="x", http_async_client=http)

    @task
    async def call_model(prompt: str) -> str:
        return str((await model.ainvoke(prompt)).content)

    @task(name="critic")  # a task's given name is its agent
    async def review(text: str) -> str:
        async for _ in model.astream(f"review {text}"):
            pass
        return "ok"

    @entrypoint()
    async def agent(question: str) -> str:
        for i in range(3):
            await call_model(f"{question} {i}")
        await asyncio.gather(review("x"), review("y"))
        return await call_model("final")

    async def both() -> None:
        await asyncio.gather(
            *(agent.ainvoke(q, {"configurable": {"thread_id": q}}) for q in ("p", "q"))
        )

    with profiled(rows):
        asyncio.run(both())
    assert len(rows) == 12 and all(r.status == "ok" for r in rows)
    for thread in ("p", "q"):
        mine = [r for r in rows if r.thread_id == thread]
        assert len({r.workflow_run_id for r in mine}) == 1
        assert who(mine[:3]) == [
            ("call_model", 1, None),
            ("call_model", 2, "call_model"),  # a return to itself
            ("call_model", 3, "call_model"),
        ]
        assert who(mine[3:5]) == [("critic", 1, "call_model")] * 2
        assert who(mine[5:]) == [("call_model", 4, "critic")]
        assert mine[3].graph_node == "agent/critic"


def test_a_graph_inside_a_task_is_the_tasks_agent(engine: Engine, rows: list) -> None:
    """The multi-agent Functional API pattern: each agent a prebuilt react agent invoked in a
    task of its own, the entrypoint handing off between them."""
    from langgraph.prebuilt import create_react_agent

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        travel = create_react_agent(llm(engine), [lookup])
        hotels = create_react_agent(llm(engine), [])

    @task
    def travel_advisor(question: str) -> str:
        return str(travel.invoke({"messages": [("user", question)]})["messages"][-1].content)

    @task
    def hotel_advisor(question: str) -> str:
        return str(hotels.invoke({"messages": [("user", question)]})["messages"][-1].content)

    @entrypoint()
    def workflow(question: str) -> str:
        answer = travel_advisor(question).result()
        answer = hotel_advisor(answer).result()
        return travel_advisor(answer).result()

    with profiled(rows):
        workflow.invoke("where to?")
    assert who(rows) == [
        ("travel_advisor", 1, None),
        ("travel_advisor", 1, "travel_advisor"),  # the react loop after its tool
        ("hotel_advisor", 1, "travel_advisor"),
        ("travel_advisor", 2, "hotel_advisor"),
        ("travel_advisor", 2, "travel_advisor"),
    ]
    assert {r.graph_node for r in rows} == {
        "workflow/travel_advisor/agent",
        "workflow/hotel_advisor/agent",
    }


class State(TypedDict):
    n: int


def test_tasks_inside_a_graph_node_keep_the_node_as_agent(engine: Engine, rows: list) -> None:
    """A StateGraph node calling `@task`s is still the agent (the rule is the entrypoint's);
    its tasks are ordered as they ran: sequential ones follow each other, gathered ones not."""
    model = llm(engine)

    @task
    def step(text: str) -> str:
        return str(model.invoke(text).content)

    def planner(s: State) -> dict:
        step("one").result()
        [f.result() for f in [step("a"), step("b")]]
        return {}

    g = StateGraph(State)
    g.add_node(
        "first", lambda s: (model.invoke("go"), {})[1], metadata={"kvscope": {"agent": "a0"}}
    )
    g.add_node("planner", planner)
    g.add_edge(START, "first")
    g.add_edge("first", "planner")
    with profiled(rows):
        g.compile().invoke({"n": 0})
    assert who(rows[:2]) == [("a0", 1, None), ("planner", 1, "a0")]
    assert who(rows[2:]) == [("planner", 1, "planner")] * 2  # after `one`, not each other
    assert {r.graph_node for r in rows[1:]} == {"planner/step"}


def test_a_task_that_raises_and_one_that_fails_its_call(engine: Any, rows: list) -> None:
    """A task retried after it raised is one visit; its calls still follow what came before."""
    model = llm(engine)
    attempts: list[int] = []

    @task(retry_policy=__import__("langgraph.types").types.RetryPolicy(initial_interval=0.01))
    def flaky(text: str) -> str:
        model.invoke(text)
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("try again")
        return "ok"

    @task
    def after(text: str) -> str:
        return str(model.invoke(text).content)

    @entrypoint()
    def workflow(q: str) -> str:
        flaky(q).result()
        return after(q).result()

    with profiled(rows):
        workflow.invoke("q")
    assert who(rows) == [("flaky", 1, None), ("flaky", 1, "flaky"), ("after", 1, "flaky")]


def test_launched_together_on_a_full_pool(rows: list) -> None:
    """Tasks are ordered by when the caller launched them, not when they started: six
    researchers on a pool of three workers (the entrypoint holds one; most tasks wait for a
    free one, starting after a sibling ended) are still one visit; a step loop beside a
    background task is still a sequence. The task callable is wrapped only while profiling.
    (Two workers: LangGraph 1.2 itself hangs.)"""
    import langgraph.func

    engine = Slow()  # 100 ms: far longer than launching six tasks, even on a loaded machine
    model = llm(engine)
    unwrapped = langgraph.func._TaskFunction.__call__

    @task
    def researcher(topic: str) -> str:
        return str(model.invoke(topic).content)

    @task
    def background(text: str) -> str:
        time.sleep(0.2)  # no call: only running beside the steps
        return text

    @task
    def step(i: int) -> str:
        return str(model.invoke(f"step {i}").content)

    @entrypoint()
    def fan(question: str) -> list[str]:
        return [f.result() for f in [researcher(str(i)) for i in range(6)]]

    @entrypoint()
    def loop(question: str) -> None:
        pending = background(question)
        for i in range(3):
            step(i).result()
        pending.result()

    with profiled(rows):
        fan.invoke("q", {"max_concurrency": 3})
        loop.invoke("q")
    assert who(rows[:6]) == [("researcher", 1, None)] * 6
    assert who(rows[6:]) == [("step", 1, None), ("step", 2, "step"), ("step", 3, "step")]
    assert langgraph.func._TaskFunction.__call__ is unwrapped
