"""Agent identity from LangGraph at run time, through the whole path: a graph's nodes call the
stand-in vLLM with ChatOpenAI or the OpenAI SDK, the interception names each call's row."""

import asyncio
import json
import operator
import warnings
from typing import Annotated, Any, TypedDict

import httpx2
import openai
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from vllm_stub import REPLY, Stub

import kvscope
from kvscope.config import EngineConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.intercept import Interceptor
from kvscope.probe.wire import CallContext
from kvscope.records.invocations import InvocationError
from kvscope.records.requests import RequestRecord
from kvscope.records.tools import ToolCall

BASE = "http://engine:8000"


class Engine(Stub):
    """The stand-in vLLM, answering a tool call to a request that offers tools (once)."""

    def transport(self, lib: Any, asynchronous: bool = False) -> Any:
        plain = super().transport(lib, asynchronous)

        def handle(request: Any) -> Any:
            body = json.loads(request.content)
            if "tools" in body and not any(m["role"] == "tool" for m in body["messages"]):
                self.received.append((str(request.url), body, dict(request.headers)))
                call = {"id": "c1", "type": "function"}
                call["function"] = {"name": "lookup", "arguments": '{"q": "x"}'}
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                reply = {**REPLY, "choices": [{"index": 0, "message": message}]}
                return lib.Response(200, json=reply)
            return plain.handle_request(request)

        return lib.MockTransport(handle)


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def rows() -> list[RequestRecord]:
    return []


def llm(engine: Engine) -> ChatOpenAI:
    http = httpx2.Client(transport=engine.transport(httpx2))
    return ChatOpenAI(model="smollm2", base_url=f"{BASE}/v1", api_key="x", http_client=http)


def profiled(
    rows: list[RequestRecord],
    tools: list[ToolCall] | None = None,
    errors: list[InvocationError] | None = None,
) -> Interceptor:
    ctx = CallContext("bench", "exp", "hash", "langgraph", 1, "smollm2", None, rows.append)
    append = tools.append if tools is not None else None
    on_error = errors.append if errors is not None else None
    return Interceptor(VllmEngine(EngineConfig()), BASE, ctx, on_tool=append, on_error=on_error)


class Loop(TypedDict):
    n: int


def planner_executor_loop(planner: Any, executor: Any) -> Any:
    """Planner -> Executor -> Planner ... until the planner has run twice (sync or async nodes)."""
    g = StateGraph(Loop)
    g.add_node("planner", planner)
    g.add_node("executor", executor)
    g.add_edge(START, "planner")
    g.add_edge("planner", "executor")
    g.add_conditional_edges("executor", lambda s: END if s["n"] >= 2 else "planner")
    return g.compile()


def test_two_nodes_in_a_loop_turns_and_previous_agents(engine: Engine, rows: list) -> None:
    model = llm(engine)

    def planner(s: Loop) -> dict:
        model.invoke("plan")
        return {"n": s["n"] + 1}

    def executor(s: Loop) -> dict:
        model.invoke("do")
        return {}

    app = planner_executor_loop(planner, executor)
    with profiled(rows):
        app.invoke({"n": 0}, {"configurable": {"thread_id": "t-1"}})
        app.invoke({"n": 1}, {"configurable": {"thread_id": "t-1"}})
    first, second = rows[:4], rows[4:]
    assert [(r.agent_id, r.turn_id, r.previous_agent_id) for r in first] == [
        ("planner", 1, None),
        ("executor", 1, "planner"),
        ("planner", 2, "executor"),
        ("executor", 2, "planner"),
    ]
    assert [(r.agent_id, r.turn_id, r.previous_agent_id) for r in second] == [
        ("planner", 1, None),
        ("executor", 1, "planner"),
    ]
    assert {r.thread_id for r in rows} == {"t-1"}
    assert len({r.workflow_run_id for r in first}) == 1
    assert len({r.workflow_run_id for r in second}) == 1
    assert first[0].workflow_run_id != second[0].workflow_run_id  # one id per invocation
    assert [r.graph_node for r in first] == ["planner", "executor"] * 2
    assert all(r.status == "ok" and r.cached_tokens is not None for r in rows)
    sent = [body for _, body, _ in engine.received]
    assert [b["request_id"] for b in sent] == [r.request_uuid for r in rows]


def test_a_subgraph_node_is_the_agent_and_its_inner_node_is_in_the_path(
    engine: Engine, rows: list
) -> None:
    model = llm(engine)

    def inner(s: Loop) -> dict:
        model.invoke("inner")
        return {}

    sub = StateGraph(Loop)
    sub.add_node("draft", inner)
    sub.add_edge(START, "draft")
    g = StateGraph(Loop)
    g.add_node("first", lambda s: (model.invoke("a"), {})[1])
    g.add_node("writer", sub.compile())
    g.add_edge(START, "first")
    g.add_edge("first", "writer")
    with profiled(rows):
        g.compile().invoke({"n": 0})
    assert [(r.agent_id, r.graph_node, r.previous_agent_id) for r in rows] == [
        ("first", "first", None),
        ("writer", "writer/draft", "first"),
    ]
    assert rows[0].workflow_run_id == rows[1].workflow_run_id
    assert rows[0].thread_id is None  # the app gave none


def test_a_react_agent_as_a_named_node_with_a_tool(engine: Engine, rows: list) -> None:
    from langgraph.prebuilt import create_react_agent

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        import time

        time.sleep(0.02)
        return "found"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(llm(engine), [lookup])
    g = StateGraph(Loop)
    g.add_node("planner", lambda s: (llm(engine).invoke("plan"), {})[1])
    g.add_node("researcher", lambda s: (agent.invoke({"messages": [("user", "q")]}), {})[1])
    g.add_edge(START, "planner")
    g.add_edge("planner", "researcher")
    tools: list[ToolCall] = []
    with profiled(rows, tools):
        g.compile().invoke({"n": 0}, {"configurable": {"thread_id": "t"}})
    assert [(r.agent_id, r.graph_node) for r in rows] == [
        ("planner", "planner"),
        ("researcher", "researcher/agent"),
        ("researcher", "researcher/agent"),
    ]
    _, first, second = rows
    assert (first.previous_agent_id, second.previous_agent_id) == ("planner", "researcher")
    assert first.turn_id == second.turn_id == 1  # one visit of the researcher
    assert first.tool_ms is None and second.tool_ms is not None and second.tool_ms >= 20
    [span] = tools
    assert (span.name, span.graph_node, span.error) == ("lookup", "researcher/tools", None)
    assert span.input is not None and "'q': 'x'" in span.input  # the model's tool arguments
    assert span.output == "found"
    assert span.workflow_run_id == second.workflow_run_id
    assert span.end_ns - span.start_ns >= 20e6


class Fan(TypedDict):
    topic: str
    done: Annotated[list, operator.add]


def test_send_fan_out_branches_follow_the_dispatcher(engine: Engine, rows: list) -> None:
    client = openai.OpenAI(
        base_url=f"{BASE}/v1",
        api_key="x",
        http_client=httpx2.Client(transport=engine.transport(httpx2)),
    )

    def ask(text: str) -> None:  # plain OpenAI SDK calls inside the nodes
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])

    def dispatcher(s: Fan) -> dict:
        ask("split")
        return {}

    def worker(s: Fan) -> dict:
        ask(s["topic"])
        return {"done": [s["topic"]]}

    def summary(s: Fan) -> dict:
        ask("sum")
        return {}

    g = StateGraph(Fan)
    g.add_node("dispatcher", dispatcher)
    g.add_node("worker", worker)
    g.add_node("summary", summary)
    g.add_edge(START, "dispatcher")
    fan = [Send("worker", {"topic": t, "done": []}) for t in ("a", "b", "c")]
    g.add_conditional_edges("dispatcher", lambda s: fan)
    g.add_edge("worker", "summary")
    with profiled(rows):
        g.compile().invoke({"topic": "", "done": []})
    workers = [r for r in rows if r.agent_id == "worker"]
    assert len(workers) == 3
    assert {r.previous_agent_id for r in workers} == {"dispatcher"}
    assert {r.turn_id for r in workers} == {1}
    assert rows[-1].agent_id == "summary" and rows[-1].previous_agent_id == "worker"


def test_send_fan_out_inside_a_subgraph(engine: Engine, rows: list) -> None:
    """A team subgraph whose inner nodes name their agents (node metadata): its dispatcher
    sends three parallel workers, a join follows. The branches, one top-level task and one
    top-level superstep, are parallel at the subgraph's level: each follows the dispatcher,
    never a sibling; the join follows a worker."""
    model = llm(engine)

    def ask(text: str) -> None:
        model.invoke(text)

    def worker(s: Fan) -> dict:
        ask(s["topic"])
        return {"done": [s["topic"]]}

    def named(agent: str) -> dict:
        return {"kvscope": {"agent": agent}}

    sub = StateGraph(Fan)
    sub.add_node("dispatcher", lambda s: (ask("split"), {})[1], metadata=named("dispatcher"))
    sub.add_node("worker", worker, metadata=named("worker"))
    sub.add_node("join", lambda s: (ask("sum"), {})[1], metadata=named("join"))
    sub.add_edge(START, "dispatcher")
    fan = [Send("worker", {"topic": t, "done": []}) for t in ("a", "b", "c")]
    sub.add_conditional_edges("dispatcher", lambda s: fan)
    sub.add_edge("worker", "join")
    g = StateGraph(Fan)
    g.add_node("first", lambda s: (ask("go"), {})[1])
    g.add_node("team", sub.compile())
    g.add_edge(START, "first")
    g.add_edge("first", "team")
    with profiled(rows):
        g.compile().invoke({"topic": "", "done": []})
    got = [(r.agent_id, r.previous_agent_id) for r in rows]
    assert got[:2] == [("first", None), ("dispatcher", "first")]
    assert got[2:5] == [("worker", "dispatcher")] * 3  # not a sibling branch
    assert got[5] == ("join", "worker")
    assert {r.graph_node for r in rows[2:5]} == {"team/worker"}
    assert {r.turn_id for r in rows[1:]} == {1}  # one visit of each agent


def test_override_node_metadata_and_annotations(engine: Engine, rows: list) -> None:
    model = llm(engine)

    def both(s: Loop) -> dict:
        with kvscope.agent("critic"):
            model.invoke("x")
        model.invoke("y")
        return {}

    g = StateGraph(Loop)
    g.add_node("n1", both, metadata={"kvscope": {"agent": "writer", "layout": "role-first"}})
    g.add_edge(START, "n1")
    with profiled(rows), kvscope.annotate(prompt_template_version="v7", fixed_prefix_tokens=12):
        g.compile().invoke({"n": 0})
    assert [(r.agent_id, r.graph_node) for r in rows] == [("critic", "n1"), ("writer", "n1")]
    assert rows[1].previous_agent_id == "critic"  # earlier in the same task
    assert all(r.prompt_template_version == "v7" for r in rows)
    assert all((r.prompt_layout, r.fixed_prefix_tokens) == ("role-first", 12) for r in rows)
    with pytest.raises(ValueError, match="unknown annotation"), kvscope.annotate(layuot="x"):
        pass


def test_calls_outside_any_graph(engine: Engine, rows: list) -> None:
    with profiled(rows):
        llm(engine).invoke("no graph")
        with kvscope.agent("planner"):
            llm(engine).invoke("named")
    assert [(r.agent_id, r.workflow_run_id, r.turn_id, r.graph_node) for r in rows] == [
        (None, None, None, None),
        ("planner", None, None, None),
    ]


def test_concurrent_async_invocations_keep_their_own_identity(engine: Engine, rows: list) -> None:
    http = httpx2.AsyncClient(transport=engine.transport(httpx2, asynchronous=True))
    model = ChatOpenAI(model="m", base_url=f"{BASE}/v1", api_key="x", http_async_client=http)

    async def planner(s: Loop) -> dict:
        await model.ainvoke("plan")
        return {"n": s["n"] + 1}

    async def executor(s: Loop) -> dict:
        async for _ in model.astream("do"):
            pass
        return {}

    app = planner_executor_loop(planner, executor)

    async def both() -> None:
        await asyncio.gather(
            *(app.ainvoke({"n": 0}, {"configurable": {"thread_id": t}}) for t in ("a", "b"))
        )

    with profiled(rows):
        asyncio.run(both())
    assert len(rows) == 8 and all(r.status == "ok" for r in rows)
    for thread in ("a", "b"):
        mine = [r for r in rows if r.thread_id == thread]
        assert len({r.workflow_run_id for r in mine}) == 1
        assert [(r.agent_id, r.turn_id, r.previous_agent_id) for r in mine] == [
            ("planner", 1, None),
            ("executor", 1, "planner"),
            ("planner", 2, "executor"),
            ("executor", 2, "planner"),
        ]
    assert all(r.ttft_ms is not None for r in rows if r.agent_id == "executor")
