"""Agent identity in AutoGen apps (`autogen-agentchat` 0.7.5, `autogen-ext[openai]`), read from
AgentChat's own runtime (probe/autogen.py), run in AutoGen's own virtualenv (framework_venv)
against the stand-in engine: the agent is its `name`, a `team.run` (or a single `agent.run`)
the workflow, an agent's k-th speaking turn its turn, the previous call's agent the transition,
tool time charged to the agent's next call; a RoundRobinGroupChat run twice, a SelectorGroupChat
(its speaker selection named as AutoGen names the manager), a single agent, two teams at once
(asyncio.gather, threads), a team inside a team, examples/autogen_app.py. A driver script
(DRIVER, written into a temporary folder) runs the app with `kvscope.probe.autogen` watching and
records `place()` for each chat completion as it leaves httpx2 (the OpenAI SDK >= 3's httpx).
The stand-in engine answers every request with the same text and makes no tool calls: where an
agent must call its tool, the driver answers that request itself with a scripted tool call (the
request still leaves httpx2). AutoGen is imported once per driver: one driver (the module's
`driven` fixture) runs every pattern the session selected, each in a process forked from it
(fork_patterns: its own records and stdout; a failure fails only its own tests); `_late` runs
in a driver of its own, which imports AutoGen before `watch()`.
"""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import fork_patterns
import pytest
from framework_venv import framework_python

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PATTERN_TIMEOUT_S = 240
SHARED = {  # the patterns one driver runs (each forked from it), in order -> the test reading it
    "round_robin": "test_round_robin_runs", "own_runtime": "test_round_robin_runs",
    "selector": "test_selector_group_chat", "single": "test_single_agent_runs",
    "gather": "test_teams_at_once", "threads": "test_teams_at_once", "tools": "test_tool_time",
    "nested": "test_team_in_a_team", "example": "test_example_app",
    "failing": "test_a_team_run_that_raises_is_an_invocation_error",
}  # fmt: skip
TOOL_S = 0.05
MANAGER = "SelectorGroupChatManager"  # AutoGen's name for a SelectorGroupChat's manager

DRIVER = r'''
import asyncio, dataclasses, json, os, sys, threading
import fork_patterns
from kvscope.probe import autogen as probe

OUT, PATTERNS = sys.argv[1], sys.argv[2:]
LATE = any(p.endswith("_late") for p in PATTERNS)
assert not LATE or len(PATTERNS) == 1, "a _late pattern imports autogen first: a driver of its own"
if not LATE:
    probe.watch()  # before autogen is imported: the post-import hooks install
import httpx2
from autogen_agentchat.agents import AssistantAgent, BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import TextMessage
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat
from autogen_core.models import ModelInfo, UserMessage
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

if LATE:
    probe.watch()  # after: installs at once
LOCK = threading.Lock()
RECORDS: list = []
ERRORS: list = []  # the invocations that raised, as the active tracker was told of them
FAILED: list = []  # the exceptions the app's runs raised, by type name
TOOL_S = float(os.environ["TOOL_S"])


def scripted(request):
    """A tool call where an agent has tools and no tool result yet (the stand-in makes none)."""
    body = json.loads(request.content)
    if not body.get("tools") or any(m.get("role") == "tool" for m in body["messages"]):
        return None
    message = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}
    return httpx2.Response(200, request=request, json={
        "id": "scripted", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def record(request):
    if request.method == "POST" and request.url.path.endswith("/chat/completions"):
        here = probe.place()
        with LOCK:
            RECORDS.append(None if here is None else dataclasses.asdict(here))


send, asend = httpx2.Client.send, httpx2.AsyncClient.send


def send_recorded(self, request, **kwargs):
    record(request)
    return scripted(request) or send(self, request, **kwargs)


async def asend_recorded(self, request, **kwargs):
    record(request)
    return scripted(request) or await asend(self, request, **kwargs)


httpx2.Client.send, httpx2.AsyncClient.send = send_recorded, asend_recorded


def client(tools=False, **kwargs):
    info = ModelInfo(vision=False, function_calling=tools, json_output=False, family="unknown",
                     structured_output=False)
    return OpenAIChatCompletionClient(model="SmolLM2-135M-Instruct", model_info=info,
                                      max_tokens=8, **kwargs)


def agents(*names):
    return [AssistantAgent(n, model_client=client(), system_message="Be brief.") for n in names]


def round_robin(name, messages=5):
    return RoundRobinGroupChat(agents("writer", "critic"), name=name,
                               termination_condition=MaxMessageTermination(messages))


async def lookup() -> str:
    """Look it up."""
    await asyncio.sleep(TOOL_S)
    return "42"


class Looker(BaseChatAgent):
    """The app's own agent: runs its tool twice, then asks the model twice."""

    def __init__(self, name):
        super().__init__(name, "Looks things up.")
        self._tool, self._client = FunctionTool(lookup, "Look it up."), client()

    @property
    def produced_message_types(self):
        return (TextMessage,)

    async def on_messages(self, messages, cancellation_token):
        for _ in range(2):
            await self._tool.run_json({}, cancellation_token)
        ask = [UserMessage(content="Hi", source="user")]
        result = await self._client.create(ask)
        await self._client.create(ask)
        return Response(chat_message=TextMessage(content=str(result.content), source=self.name))

    async def on_reset(self, cancellation_token):
        pass


async def main(pattern):
    if pattern == "round_robin":
        team = round_robin("review")
        await team.run(task="Write a haiku.")
        await team.run(task="Another one.")
    elif pattern == "own_runtime":  # the app's runtime, started before the run
        from autogen_core import SingleThreadedAgentRuntime
        runtime = SingleThreadedAgentRuntime()
        runtime.start()
        team = RoundRobinGroupChat(agents("writer", "critic"), name="review", runtime=runtime,
                                   termination_condition=MaxMessageTermination(5))
        await team.run(task="Write a haiku.")
        await team.run(task="Another one.")
        await runtime.stop_when_idle()
    elif pattern == "selector":
        team = SelectorGroupChat(agents("writer", "critic", "editor"), model_client=client(),
                                 termination_condition=MaxMessageTermination(3),
                                 max_selector_attempts=2)
        await team.run(task="Write a haiku.")
    elif pattern == "single":
        ask = [UserMessage(content="Hi", source="user")]
        await client().create(ask)  # outside any agent
        (solo,) = agents("solo")
        await solo.run(task="Hi.")
        await solo.run(task="Again.")
        async for _ in solo.run_stream(task="Once more."):
            pass
        streamer = AssistantAgent("streamer", model_client=client(), model_client_stream=True)
        async for _ in streamer.run_stream(task="Stream it."):  # the request leaves in a task
            pass
        await client().create(ask)
    elif pattern == "gather":
        await asyncio.gather(one_run(1), one_run(2))
    elif pattern == "tools":
        helper = AssistantAgent("helper", model_client=client(tools=True), tools=[lookup],
                                reflect_on_tool_use=True)
        team = RoundRobinGroupChat([Looker("looker"), helper, *agents("writer")],
                                   termination_condition=MaxMessageTermination(4))
        await team.run(task="Go.")
    elif pattern == "failing":  # the critic's engine is gone: the team run raises
        from kvscope.probe import run_tracker
        run_tracker.activate(None, lambda e: ERRORS.append(dataclasses.asdict(e)))
        gone = client(base_url="http://127.0.0.1:9/v1", max_retries=0)
        critic = AssistantAgent("critic", model_client=gone, system_message="Be brief.")
        team = RoundRobinGroupChat([*agents("writer"), critic], name="review",
                                   termination_condition=MaxMessageTermination(5))
        try:
            await team.run(task="Write a haiku.")
        except Exception as e:
            FAILED.append(type(e).__name__)
    elif pattern == "nested":
        inner = RoundRobinGroupChat(agents("a", "b"), name="inner",
                                    termination_condition=MaxMessageTermination(2))
        outer = RoundRobinGroupChat([*agents("lead"), inner], name="outer",
                                    termination_condition=MaxMessageTermination(4))
        await outer.run(task="Go.")


async def one_run(i):
    await round_robin(f"team{i}").run(task="Go.")


def run(pattern):
    pattern = pattern.removesuffix("_late")
    if pattern == "threads":  # asyncio.run in two threads at once, a team run in each
        threads = [threading.Thread(target=asyncio.run, args=(one_run(i),)) for i in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elif pattern == "example":  # the example as `python examples/autogen_app.py --selector`
        import runpy
        sys.argv = ["autogen_app.py", "--selector", "--tasks", "2", "--messages", "4"]
        runpy.run_path(os.environ["EXAMPLE"], run_name="__main__")
    else:
        asyncio.run(main(pattern))
    if pattern == "failing":
        return {"places": RECORDS, "errors": ERRORS, "failed": FAILED}
    return RECORDS


fork_patterns.run_each(PATTERNS, run, OUT, float(os.environ["PATTERN_TIMEOUT_S"]), home=False)
'''


@pytest.fixture(scope="module")
def python() -> Path:
    return framework_python("autogen")


@pytest.fixture(scope="module")
def probe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding only `kvscope`, a link to the repository's src/kvscope."""
    path = tmp_path_factory.mktemp("probe")
    (path / "kvscope").symlink_to(ROOT / "src" / "kvscope", target_is_directory=True)
    return path


def run_driver(
    python: Path, probe_path: Path, engine: str, folder: Path, patterns: list[str]
) -> tuple[Path, str]:
    """Run DRIVER's `patterns` in AutoGen's virtualenv, one driver (AutoGen imported once), each
    pattern in a child forked from it: the folder of their outputs and the driver's stderr."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        "PYTHONPATH": str(probe_path), "OPENAI_BASE_URL": engine, "OPENAI_API_KEY": "none",
        "TOOL_S": str(TOOL_S), "EXAMPLE": str(ROOT / "examples" / "autogen_app.py"),
    }  # fmt: skip
    return fork_patterns.start_driver(python, DRIVER, folder, patterns, env, PATTERN_TIMEOUT_S)


@pytest.fixture(scope="module")
def driven(
    python: Path,
    probe_path: Path,
    engine: str,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> tuple[Path, str]:
    """One driver for the patterns in SHARED of this session's selected tests."""
    folder, patterns = tmp_path_factory.mktemp("autogen"), fork_patterns.selected(request, SHARED)
    return run_driver(python, probe_path, engine, folder, patterns)


def drive(driven: tuple[Path, str], pattern: str) -> list[Any]:
    """Each chat completion's place (or None) in `pattern`; AssertionError naming it where it
    failed."""
    places, _ = fork_patterns.read(driven[0], pattern, driven[1])
    return places


def by_run(places: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The calls of each workflow, in order."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for p in places:
        runs.setdefault(p["workflow_run_id"], []).append(p)
    return runs


def check_transitions(calls: list[dict[str, Any]]) -> None:
    """previous_agent_id: the agent of the run's previous call (None for the first)."""
    assert [c["previous_agent_id"] for c in calls] == [None] + [c["agent_id"] for c in calls[:-1]]


def check_round_robin(calls: list[dict[str, Any]], team: str) -> None:
    """writer, critic, writer, critic: turns 1, 1, 2, 2, named `team/agent`."""
    assert [(c["agent_id"], c["turn_id"]) for c in calls] == [
        ("writer", 1), ("critic", 1), ("writer", 2), ("critic", 2)]  # fmt: skip
    assert [c["graph_node"] for c in calls] == [f"{team}/{c['agent_id']}" for c in calls]
    assert all(c["thread_id"] is None and c["tool_ms"] is None for c in calls)
    assert all(c["workflow_run_id"].startswith("autogen_") for c in calls)
    check_transitions(calls)


@pytest.mark.parametrize("pattern", ["round_robin", "round_robin_late", "own_runtime"])
def test_round_robin_runs(python: Path, probe_path: Path, engine: str, driven: tuple[Path, str],
                          tmp_path: Path, pattern: str) -> None:  # fmt: skip
    """The same team run twice; watch() before or after autogen's import (`_late`: a driver of
    its own); the team in the app's own runtime, started before the runs (no context of the
    run's to inherit)."""
    if pattern.endswith("_late"):
        driven = run_driver(python, probe_path, engine, tmp_path, [pattern])
    places = drive(driven, pattern)
    assert None not in places and len(places) == 8
    runs = by_run(places)
    assert len(runs) == 2  # one workflow per team.run, the same team run twice
    for calls in runs.values():
        check_round_robin(calls, "review")


def test_selector_group_chat(driven: tuple[Path, str]) -> None:
    places = drive(driven, "selector")
    assert None not in places
    (calls,) = by_run(places).values()
    agents = [c["agent_id"] for c in calls]
    # two speaker selections (the stand-in never answers a name: max_selector_attempts=2 calls
    # each), each followed by the speaker AutoGen falls back to: the first participant, then
    # the previous speaker
    assert agents == [MANAGER, MANAGER, "writer", MANAGER, MANAGER, "writer"]
    assert [c["turn_id"] for c in calls] == [1, 1, 1, 2, 2, 2]
    assert {c["graph_node"] for c in calls} == {f"SelectorGroupChat/{a}" for a in agents}
    check_transitions(calls)


def test_single_agent_runs(driven: tuple[Path, str]) -> None:
    places = drive(driven, "single")
    assert places[0] is None and places[-1] is None  # a model call outside any agent
    inside = places[1:-1]  # agent.run, run, run_stream; a streaming agent's run_stream
    assert len(inside) == 4 and len(by_run(inside)) == 4
    seen = [(p["agent_id"], p["graph_node"], p["turn_id"], p["previous_agent_id"]) for p in inside]
    assert seen == [("solo", "solo", 1, None)] * 3 + [("streamer", "streamer", 1, None)]


@pytest.mark.parametrize("pattern", ["gather", "threads"])
def test_teams_at_once(driven: tuple[Path, str], pattern: str) -> None:
    """Two team runs at once (asyncio.gather, or asyncio.run in two threads) keep their own."""
    places = drive(driven, pattern)
    assert None not in places and len(places) == 8
    runs = by_run(places)
    assert len(runs) == 2
    teams = set()
    for calls in runs.values():
        team = calls[0]["graph_node"].split("/")[0]
        teams.add(team)
        check_round_robin(calls, team)
    assert teams == {"team1", "team2"}
    if pattern == "gather":  # the runs interleave: each run's first call before the other's last
        spans = [[i for i, p in enumerate(places) if p["workflow_run_id"] == w] for w in runs]
        assert max(s[0] for s in spans) < min(s[-1] for s in spans)


def test_tool_time(driven: tuple[Path, str]) -> None:
    """Tool time goes to the agent's next call: the app's own agent's (two runs of a tool), an
    AssistantAgent's (its tool call, then its reflection on the result in the same turn)."""
    places = drive(driven, "tools")
    (calls,) = by_run(places).values()
    assert [(c["agent_id"], c["turn_id"]) for c in calls] == [
        ("looker", 1), ("looker", 1), ("helper", 1), ("helper", 1), ("writer", 1)]  # fmt: skip
    tool_ms = [c["tool_ms"] for c in calls]
    assert 2 * TOOL_S * 1000 <= tool_ms[0] < 2 * TOOL_S * 1000 + 500
    assert TOOL_S * 1000 <= tool_ms[3] < TOOL_S * 1000 + 500
    assert tool_ms[1] is None and tool_ms[2] is None and tool_ms[4] is None
    assert [c["graph_node"] for c in calls] == [f"RoundRobinGroupChat/{c['agent_id']}" for c in
                                                calls]  # fmt: skip
    check_transitions(calls)


def test_team_in_a_team(driven: tuple[Path, str]) -> None:
    """A team as a participant runs inside the outer team's workflow, named under it."""
    places = drive(driven, "nested")
    (calls,) = by_run(places).values()
    nodes = {c["agent_id"]: c["graph_node"] for c in calls}
    assert nodes["lead"] == "outer/lead" and nodes["a"] == "outer/inner/a"
    check_transitions(calls)


def test_example_app(driven: tuple[Path, str]) -> None:
    """examples/autogen_app.py --selector: two team runs, every call named."""
    places = drive(driven, "example")
    assert None not in places
    runs = by_run(places)
    assert len(runs) == 2
    for calls in runs.values():
        assert calls[0]["agent_id"] == MANAGER
        assert {c["agent_id"] for c in calls} <= {MANAGER, "planner", "writer", "critic"}
        assert all(c["graph_node"] == f"writers_room/{c['agent_id']}" for c in calls)
        check_transitions(calls)


def test_standard_library_only(probe_path: Path) -> None:
    """probe/autogen.py imports in a bare interpreter (-I: no site-packages) with only kvscope's
    source on the path, and loads nothing but the standard library and kvscope.probe."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules)\n"
        "import kvscope.probe.autogen as a; a.watch(); assert a.place() is None\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'kvscope'}))"
    )
    base = getattr(sys, "_base_executable", sys.executable)
    done = subprocess.run([base, "-I", "-c", code, str(probe_path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_team_run_that_raises_is_an_invocation_error(driven: tuple[Path, str]) -> None:
    """A team run whose critic cannot reach its engine raises: the tracker hears of an
    invocation that raised, under the run's workflow id and the exception's type (its trace's
    root is then ERROR)."""
    result = drive(driven, "failing")
    (calls,) = by_run(result["places"]).values()
    assert [c["agent_id"] for c in calls][:2] == ["writer", "critic"]
    assert len(result["failed"]) == 1
    assert [(e["workflow_run_id"], e["error_type"]) for e in result["errors"]] == [
        (calls[0]["workflow_run_id"], result["failed"][0])
    ]
