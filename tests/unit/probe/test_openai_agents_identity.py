"""Agent identity in OpenAI Agents SDK apps (`openai-agents`), read from the SDK's own run context
(probe/openai_agents.py): the agent is `Agent.name`, a hand-off a transition, a `Runner.run` the
workflow, the trace's group_id the thread, a return to an agent its next turn; with the SDK's
tracing on and off. The stand-in engine answers a request that offers the script's next tool
(a hand-off is the `transfer_to_<agent>` tool) with a call of it."""

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from helpers import ROOT
from openai import AsyncOpenAI
from test_identity import BASE, profiled
from vllm_stub import Scripted

from kvscope.records.invocations import InvocationError
from kvscope.records.requests import RequestRecord
from kvscope.records.tools import ToolCall

agents = pytest.importorskip("agents")
TOOL_S = 0.05


@pytest.fixture(autouse=True)
def no_export() -> Iterator[None]:
    """No trace leaves the test for OpenAI's backend; tracing on unless a test turns it off."""
    agents.set_trace_processors([])
    agents.set_tracing_disabled(False)
    yield
    agents.set_tracing_disabled(False)


def client_of(engine: Scripted) -> AsyncOpenAI:
    http = httpx2.AsyncClient(transport=engine.transport(httpx2, asynchronous=True))
    return AsyncOpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http)


def desk(engine: Scripted) -> Any:
    """triage <-> billing (hand-offs both ways), billing with a function tool `lookup`."""
    client = client_of(engine)
    model = agents.OpenAIChatCompletionsModel(model="smollm2", openai_client=client)

    @agents.function_tool
    def lookup() -> str:
        """Look up the customer's invoice."""
        time.sleep(TOOL_S)
        return "invoice 42: paid"

    billing = agents.Agent(name="billing", instructions="Billing.", model=model, tools=[lookup])
    triage = agents.Agent(name="triage", instructions="Route.", model=model, handoffs=[billing])
    billing.handoffs = [triage]
    return triage


def who(rows: list[RequestRecord]) -> list[tuple[str | None, int | None, str | None]]:
    return [(r.agent_id, r.turn_id, r.previous_agent_id) for r in rows]


SCRIPT = ("transfer_to_billing", "lookup", "transfer_to_triage")
EXPECTED = [
    ("triage", 1, None),
    ("billing", 1, "triage"),  # the hand-off
    ("billing", 1, "billing"),  # its tool loop: the same visit
    ("triage", 2, "billing"),  # handed back: triage's next turn
]


def check_run(rows: list[RequestRecord], thread: str | None) -> None:
    assert who(rows) == EXPECTED
    assert [r.graph_node for r in rows] == ["triage", "billing", "billing", "triage"]
    assert len({r.workflow_run_id for r in rows}) == 1 and rows[0].workflow_run_id
    assert {r.thread_id for r in rows} == {thread}
    assert [r.tool_ms is None for r in rows] == [True, True, False, True]
    assert TOOL_S * 1000 <= rows[2].tool_ms < TOOL_S * 1000 + 500  # type: ignore[operator]


@pytest.mark.parametrize("tracing", ["on", "set_tracing_disabled", "run_config"])
def test_hand_offs_tools_turns_and_runs(tracing: str) -> None:
    engine = Scripted(*SCRIPT)
    triage = desk(engine)
    if tracing == "set_tracing_disabled":
        agents.set_tracing_disabled(True)
    config = agents.RunConfig(group_id="customer-7", tracing_disabled=tracing == "run_config")
    rows: list[RequestRecord] = []
    tools: list[ToolCall] = []
    with profiled(rows, tools):
        asyncio.run(agents.Runner.run(triage, "my invoice?", run_config=config))
        engine.script = list(SCRIPT)
        agents.Runner.run_sync(triage, "again?", run_config=config)
    assert len(rows) == 8 == len(engine.received)
    first, second = rows[:4], rows[4:]
    thread = "customer-7" if tracing == "on" else None  # a no-op trace keeps no group_id
    check_run(first, thread)
    check_run(second, thread)
    assert first[0].workflow_run_id != second[0].workflow_run_id  # one workflow per run
    if tracing == "on":
        assert str(first[0].workflow_run_id).startswith("trace_")  # the SDK's own trace id
    # the function tools' runs, seen through their (no-op, with tracing off) spans
    assert [(t.name, t.graph_node, t.error) for t in tools] == [("lookup", "billing", None)] * 2
    assert [t.workflow_run_id for t in tools] == [first[0].workflow_run_id,
                                                  second[0].workflow_run_id]  # fmt: skip
    assert all(t.end_ns - t.start_ns >= TOOL_S * 1e9 for t in tools)


def test_runs_inside_one_app_trace_are_one_workflow() -> None:
    engine = Scripted(*SCRIPT)
    triage = desk(engine)
    rows: list[RequestRecord] = []

    async def conversation() -> None:
        with agents.trace("support", group_id="conv-1"):
            await agents.Runner.run(triage, "my invoice?")
            engine.script = list(SCRIPT)
            await agents.Runner.run(triage, "thanks")

    with profiled(rows):
        asyncio.run(conversation())
    assert len({r.workflow_run_id for r in rows}) == 1
    assert {r.thread_id for r in rows} == {"conv-1"}
    assert who(rows)[4:] == [("triage", 3, "triage"), ("billing", 2, "triage"),
                             ("billing", 2, "billing"), ("triage", 4, "billing")]  # fmt: skip


def test_streamed_run_and_an_explicit_agent_block() -> None:
    engine = Scripted()
    triage = desk(engine)
    rows: list[RequestRecord] = []

    async def streamed() -> None:
        result = agents.Runner.run_streamed(triage, "hi")
        async for _ in result.stream_events():
            pass

    import kvscope

    with profiled(rows):
        asyncio.run(streamed())
        with kvscope.agent("front-desk"):
            agents.Runner.run_sync(triage, "hi")
    assert who(rows) == [("triage", 1, None), ("front-desk", 1, None)]
    assert rows[0].workflow_run_id != rows[1].workflow_run_id


def test_calls_outside_an_agent_are_not_named() -> None:
    engine = Scripted()
    client = client_of(engine)
    rows: list[RequestRecord] = []
    with profiled(rows):
        asyncio.run(client.chat.completions.create(model="m", messages=[]))
    assert who(rows) == [(None, None, None)] and rows[0].workflow_run_id is None


def test_the_probe_does_not_import_the_sdk() -> None:
    code = (
        "import sys; from kvscope.probe import intercept, identity; "
        "identity.identify(); print('agents' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_installs_when_the_sdk_is_imported_after_profiling_began() -> None:
    code = (
        "import asyncio, sys; sys.path[:0] = ['tests', 'tests/unit/probe']; "
        "from test_identity import profiled; rows = []\n"
        "with profiled(rows):\n"
        "    import test_openai_agents_identity as t\n"
        "    t.agents.set_trace_processors([])\n"
        "    engine = t.Scripted(*t.SCRIPT)\n"
        "    asyncio.run(t.agents.Runner.run(t.desk(engine), 'q'))\n"
        "print([(r.agent_id, r.turn_id, r.previous_agent_id) for r in rows])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(EXPECTED)


def test_a_failing_tool_is_a_tool_row_with_the_sdks_error() -> None:
    engine = Scripted("transfer_to_billing", "lookup")
    triage = desk(engine)
    billing = triage.handoffs[0]

    @agents.function_tool
    def lookup() -> str:
        """Look up the customer's invoice."""
        raise RuntimeError("ledger down")

    billing.tools = [lookup]
    rows: list[RequestRecord] = []
    tools: list[ToolCall] = []
    with profiled(rows, tools):
        agents.Runner.run_sync(triage, "my invoice?")
    assert who(rows) == EXPECTED[:3]  # the model is told the tool failed, billing goes on
    assert [(t.name, t.graph_node) for t in tools] == [("lookup", "billing")]
    assert tools[0].error is not None and "tool" in tools[0].error.lower()


@pytest.mark.parametrize("tracing", [True, False], ids=["tracing", "no-op"])
def test_a_run_that_raises_is_an_invocation_error(tracing: bool) -> None:
    """A Runner.run that raises after its calls (here: past max_turns) is an invocation that
    raised, under its workflow id (its trace's root is then ERROR); a run that returns is not."""
    agents.set_tracing_disabled(not tracing)
    engine = Scripted(*SCRIPT)
    triage = desk(engine)
    rows: list[RequestRecord] = []
    errors: list[InvocationError] = []
    with profiled(rows, errors=errors):
        with pytest.raises(agents.exceptions.MaxTurnsExceeded):
            agents.Runner.run_sync(triage, "my invoice?", max_turns=1)
        engine.script = list(SCRIPT)
        agents.Runner.run_sync(triage, "again?")
    assert who(rows)[:1] == [("triage", 1, None)] and len(rows) == 5
    assert [(e.workflow_run_id, e.error_type) for e in errors] == [
        (rows[0].workflow_run_id, "MaxTurnsExceeded")
    ]
    assert rows[1].workflow_run_id != rows[0].workflow_run_id and errors[0].error_message


def test_an_app_trace_block_that_raises_is_an_invocation_error() -> None:
    """The app's own `with trace(...)` block (one workflow around its runs) that raises after
    a run returned: that workflow raised; a block that made no call has no trace to mark."""
    engine = Scripted(*SCRIPT)
    triage = desk(engine)
    rows: list[RequestRecord] = []
    errors: list[InvocationError] = []

    async def conversation() -> None:
        with agents.trace("support"):
            await agents.Runner.run(triage, "my invoice?")
            raise ValueError("the app's own step failed")

    with profiled(rows, errors=errors):
        with pytest.raises(ValueError):
            asyncio.run(conversation())
        with pytest.raises(KeyError), agents.trace("idle"):
            raise KeyError("no call made")
    assert len(rows) == 4 and len({r.workflow_run_id for r in rows}) == 1
    assert [(e.workflow_run_id, e.description) for e in errors] == [
        (rows[0].workflow_run_id, "ValueError: the app's own step failed")
    ]
