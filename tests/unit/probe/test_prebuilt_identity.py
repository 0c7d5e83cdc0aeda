"""Agent identity in LangGraph's prebuilt multi-agent packages as users install them:
`langgraph-supervisor` (`create_supervisor` over named agents) and `langgraph-swarm`
(`create_swarm`, hand-off tools). Each named agent is a node of the package's parent graph, so
the graph rules name the call (probe/identity.py): the agent is the named agent, a hand-off is
a transition (previous_agent_id), a return to an agent its next turn. The stand-in engine
answers a request that offers the next scripted tool with a call of it (a hand-off)."""

import warnings
from typing import Any

import httpx2
import pytest
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from test_identity import BASE, profiled
from vllm_stub import Scripted, Stub

from kvscope.records.requests import RequestRecord

supervisor = pytest.importorskip("langgraph_supervisor")
swarm = pytest.importorskip("langgraph_swarm")


def model(engine: Stub) -> ChatOpenAI:
    http = httpx2.Client(transport=engine.transport(httpx2))
    return ChatOpenAI(model="smollm2", base_url=f"{BASE}/v1", api_key="x", http_client=http)


def agent(engine: Stub, name: str, tools: list | None = None) -> Any:
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(model(engine), tools or [], name=name)


def who(rows: list[RequestRecord]) -> list[tuple[str | None, int | None, str | None]]:
    return [(r.agent_id, r.turn_id, r.previous_agent_id) for r in rows]


def test_supervisor_hands_off_to_named_agents() -> None:
    engine = Scripted("transfer_to_researcher", "transfer_to_writer")
    app = supervisor.create_supervisor(
        [agent(engine, "researcher"), agent(engine, "writer")], model=model(engine)
    ).compile()
    rows: list[RequestRecord] = []
    with profiled(rows):
        app.invoke({"messages": [("user", "why tides?")]}, {"configurable": {"thread_id": "t"}})
    assert who(rows) == [
        ("supervisor", 1, None),
        ("researcher", 1, "supervisor"),
        ("supervisor", 2, "researcher"),
        ("writer", 1, "supervisor"),
        ("supervisor", 3, "writer"),
    ]
    assert [r.graph_node for r in rows[:2]] == ["supervisor/agent", "researcher/agent"]
    assert len({r.workflow_run_id for r in rows}) == 1 and {r.thread_id for r in rows} == {"t"}


def test_swarm_hand_offs_and_the_active_agent_across_invocations() -> None:
    engine = Scripted("transfer_to_bob", "transfer_to_alice", "transfer_to_bob")
    alice = agent(engine, "alice", [swarm.create_handoff_tool(agent_name="bob")])
    bob = agent(engine, "bob", [swarm.create_handoff_tool(agent_name="alice")])
    app = swarm.create_swarm([alice, bob], default_active_agent="alice").compile(
        checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "s"}}
    rows: list[RequestRecord] = []
    with profiled(rows):
        app.invoke({"messages": [("user", "hi")]}, config)
        app.invoke({"messages": [("user", "and then?")]}, config)
    first = [r for r in rows if r.workflow_run_id == rows[0].workflow_run_id]
    second = rows[len(first) :]
    assert who(first) == [
        ("alice", 1, None),
        ("bob", 1, "alice"),  # the hand-off is the transition
        ("alice", 2, "bob"),
        ("bob", 2, "alice"),
    ]
    assert who(second) == [("bob", 1, None)]  # the swarm resumes with the active agent
    assert {r.graph_node for r in rows} == {"alice/agent", "bob/agent"}
