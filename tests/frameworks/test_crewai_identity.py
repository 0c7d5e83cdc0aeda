"""Agent identity in CrewAI apps (`crewai`), read from CrewAI's own event bus
(probe/crewai.py), run in CrewAI's own virtualenv (framework_venv) against the stand-in engine:
the agent is its `role`, a crew kickoff the workflow (CrewAI's kickoff event id), an agent's
k-th task its turn, the previous call's agent the transition, tool time charged to the agent's
next call; a sequential crew, a hierarchical crew whose manager delegates, kickoff_for_each, two
kickoffs at once (kickoff_async, akickoff, threads), two `async_execution` tasks at once, and
examples/crewai_app.py. A driver script (DRIVER, written into a temporary folder) runs the crew
with `kvscope.probe.crewai` watching and records `place()` for each chat completion as it
reaches httpx's `Client.send` / `AsyncClient.send`. CrewAI is imported once per driver: one
driver (the module's `driven` fixture) runs every pattern the session selected, each in a
process forked from it (fork_patterns: its own records, stdout and folder; a failure fails only
its own tests); `kickoff_for_each` runs in a driver of its own, which imports CrewAI before
`watch()`. The stand-in engine answers every request with the
same text and makes no tool calls: where the crew must call a tool (the manager's delegation, a
researcher's tool), the driver's `send` answers that request itself with a scripted tool call
(recorded like the others, not sent on).
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
TOOL_S = 0.05
PATTERN_TIMEOUT_S = 300
AT_ONCE = "test_two_kickoffs_at_once_keep_their_own_ids"
SHARED = {  # the patterns one driver runs (each forked from it), in order -> the test reading it
    "sequential": "test_sequential_crew_two_kickoffs",
    "tools": "test_tool_time_charged_to_the_agents_next_call",
    "hierarchical": "test_hierarchical_crew_manager_delegates",
    "concurrent_async": AT_ONCE, "concurrent_akickoff": AT_ONCE, "concurrent_threads": AT_ONCE,
    "example": "test_the_example_app", "example_hierarchical": "test_the_example_app_hierarchical",
    "concurrent_tasks": "test_async_tasks_of_one_kickoff",
    "failing": "test_a_kickoff_that_raises_is_an_invocation_error",
}  # fmt: skip

DRIVER = r'''
import asyncio, dataclasses, json, os, sys, threading, time
import fork_patterns
from kvscope.probe import crewai as probe

OUT, PATTERNS = sys.argv[1], sys.argv[2:]
pattern = ""  # the pattern a forked child runs
if "for_each" in PATTERNS:
    assert PATTERNS == ["for_each"], "for_each imports crewai first: a driver of its own"
    import crewai  # already imported: watch() installs at once
probe.watch()  # else before crewai is imported: the post-import hook installs
import httpx
from crewai import LLM, Agent, Crew, Process, Task
from crewai.tools import tool

TOPICS = ("cats", "dogs")
LOCK = threading.Lock()
RECORDS: list = []
MANAGER_CALLS = [0]
KICKOFFS: list = []  # CrewAI's own ids of the kickoffs (Crew._kickoff_event_id)
ERRORS: list = []  # the invocations that raised, as the active tracker was told of them
FAILED: list = []  # the exceptions the app's kickoffs raised, by type name


def scripted(request: httpx.Request) -> httpx.Response | None:
    """A tool call where the crew must call a tool (the stand-in engine makes none)."""
    body = json.loads(request.content)
    if any(m.get("role") == "tool" for m in body["messages"]):
        return None
    names = [t["function"]["name"] for t in body.get("tools") or ()]
    if "delegate_work_to_coworker" in names:
        with LOCK:
            k, MANAGER_CALLS[0] = MANAGER_CALLS[0], MANAGER_CALLS[0] + 1
        editor = ("editor",) if pattern.startswith("example") else ()
        coworkers = ("researcher", "writer", *editor)
        coworker = coworkers[k % len(coworkers)]
        call = ("delegate_work_to_coworker",
                {"task": f"Help with part {k}.", "context": "None.", "coworker": coworker})
    elif "lookup" in names:
        call = ("lookup", {"topic": "cats"})
    else:
        return None
    message = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": call[0], "arguments": json.dumps(call[1])}}]}
    return httpx.Response(200, request=request, json={
        "id": "scripted", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def record(request: httpx.Request) -> None:
    if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
        return
    here = probe.place()
    text = request.content.decode()
    topic = next((t for t in TOPICS if t in text), None)
    row = None if here is None else dataclasses.asdict(here)
    with LOCK:
        RECORDS.append({"place": row, "topic": topic})


send, asend = httpx.Client.send, httpx.AsyncClient.send


def send_recorded(self, request, **kwargs):
    record(request)
    if pattern == "failing" and b"ENGINE-DOWN" in request.content:
        raise httpx.ConnectError("the engine went away", request=request)
    if pattern.startswith("concurrent"):
        time.sleep(0.2)  # the two kickoffs' calls interleave
    return scripted(request) or send(self, request, **kwargs)


async def asend_recorded(self, request, **kwargs):
    record(request)
    if pattern.startswith("concurrent"):
        await asyncio.sleep(0.2)
    return scripted(request) or await asend(self, request, **kwargs)


httpx.Client.send, httpx.AsyncClient.send = send_recorded, asend_recorded


@tool("lookup")
def lookup(topic: str) -> str:
    """Look a fact up about the topic."""
    time.sleep(TOOL_S)
    return f"{topic} sleep a lot"


def crew(hierarchical: bool = False, tools: bool = False) -> Crew:
    llm = LLM(model="SmolLM2-135M-Instruct", max_tokens=8)
    researcher = Agent(role="researcher", goal="Find a fact.", backstory="You research.",
                       llm=llm, max_iter=1, tools=[lookup] if tools else [])
    writer = Agent(role="writer", goal="Write a line.", backstory="You write.", llm=llm,
                   max_iter=1)
    facts = Task(name="facts", description="Give one fact about {topic}.",
                 expected_output="A fact.", agent=None if hierarchical else researcher)
    line = Task(description="Write one   line\nabout the fact on {topic}, short and plain, "
                "for a reader in a hurry.", expected_output="A line.",
                agent=None if hierarchical else writer)
    if hierarchical:
        return Crew(agents=[researcher, writer], tasks=[facts, line],
                    process=Process.hierarchical, manager_llm=llm)
    return Crew(agents=[researcher, writer], tasks=[facts, line], process=Process.sequential)


TOOL_S = float(os.environ["TOOL_S"])


def run(name):
    global pattern
    pattern = name
    drive_pattern()
    outside = probe.place()  # after the kickoffs: outside any
    return {"records": RECORDS, "outside": outside, "kickoffs": KICKOFFS, "errors": ERRORS,
            "failed": FAILED}


def drive_pattern():
    if pattern == "sequential":
        for topic in TOPICS:
            sequential = crew()
            sequential.kickoff(inputs={"topic": topic})
            KICKOFFS.append(sequential._kickoff_event_id)
    elif pattern == "tools":
        crew(tools=True).kickoff(inputs={"topic": "cats"})
    elif pattern == "hierarchical":
        crew(hierarchical=True).kickoff(inputs={"topic": "cats"})
    elif pattern == "for_each":
        crew().kickoff_for_each(inputs=[{"topic": t} for t in TOPICS])
    elif pattern == "concurrent_async":
        async def both():
            await asyncio.gather(*(crew().kickoff_async(inputs={"topic": t}) for t in TOPICS))
        asyncio.run(both())
    elif pattern == "concurrent_akickoff":  # CrewAI's native async path (AsyncClient)
        async def both_native():
            await asyncio.gather(*(crew().akickoff(inputs={"topic": t}) for t in TOPICS))
        asyncio.run(both_native())
    elif pattern.startswith("example"):
        import runpy
        sys.argv = ["crewai_app.py", "--topics", "2"]
        sys.argv += ["--hierarchical"] if pattern == "example_hierarchical" else []
        runpy.run_path(os.environ["EXAMPLE"], run_name="__main__")
    elif pattern == "concurrent_tasks":  # async_execution: two tasks at once in one kickoff
        c = crew()
        for task in c.tasks:
            task.async_execution = True
        summary = Task(name="summary", description="Sum up {topic}.", expected_output="A line.",
                       agent=c.agents[0], context=list(c.tasks))
        Crew(agents=c.agents, tasks=[*c.tasks, summary]).kickoff(inputs={"topic": "cats"})
    elif pattern == "failing":  # the writer's call fails: the kickoff raises
        from kvscope.probe import run_tracker
        run_tracker.activate(None, lambda e: ERRORS.append(dataclasses.asdict(e)))
        failing = crew()
        failing.tasks[1].description += " ENGINE-DOWN"
        try:
            failing.kickoff(inputs={"topic": "cats"})
        except Exception as e:
            FAILED.append(type(e).__name__)
        KICKOFFS.append(failing._kickoff_event_id)
    elif pattern == "concurrent_threads":
        threads = [threading.Thread(target=crew().kickoff, kwargs={"inputs": {"topic": t}})
                   for t in TOPICS]
        [t.start() for t in threads]
        [t.join() for t in threads]


fork_patterns.run_each(PATTERNS, run, OUT, float(os.environ["PATTERN_TIMEOUT_S"]))
'''


@pytest.fixture(scope="module")
def python() -> Path:
    return framework_python("crewai")


@pytest.fixture(scope="module")
def kvscope_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding only a `kvscope` link to this checkout's src/kvscope."""
    path = tmp_path_factory.mktemp("path")
    (path / "kvscope").symlink_to(ROOT / "src" / "kvscope")
    return path


def run_driver(
    python: Path, engine: str, kvscope_path: Path, folder: Path, patterns: list[str]
) -> tuple[Path, str]:
    """Run DRIVER's `patterns` in CrewAI's virtualenv, one driver (CrewAI imported once), each
    pattern in a child forked from it: the folder of their outputs and the driver's stderr."""
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": str(folder), "PYTHONPATH": str(kvscope_path),
        "XDG_DATA_HOME": str(folder / "data"), "OPENAI_BASE_URL": engine,
        "OPENAI_API_KEY": "x", "CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true",
        "CREWAI_TRACING_ENABLED": "false", "TOOL_S": str(TOOL_S),
        "EXAMPLE": str(ROOT / "examples" / "crewai_app.py"),
    }  # fmt: skip
    return fork_patterns.start_driver(python, DRIVER, folder, patterns, env, PATTERN_TIMEOUT_S)


@pytest.fixture(scope="module")
def driven(
    python: Path,
    engine: str,
    kvscope_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> tuple[Path, str]:
    """One driver for the patterns in SHARED of this session's selected tests."""
    folder, patterns = tmp_path_factory.mktemp("crewai"), fork_patterns.selected(request, SHARED)
    return run_driver(python, engine, kvscope_path, folder, patterns)


def drive(driven: tuple[Path, str], pattern: str) -> dict[str, Any]:
    """The `pattern`'s records (each call's place, all placed, and the topic of its prompt), the
    kickoffs' own ids where it keeps them, its stdout; AssertionError naming it where it failed."""
    result, stdout = fork_patterns.read(driven[0], pattern, driven[1])
    assert result["outside"] is None and result["records"]
    assert all(r["place"] is not None for r in result["records"]), result
    return {**result, "stdout": stdout}


def runs_of(result: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The records' places grouped by workflow_run_id, in order of first call."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in result["records"]:
        runs.setdefault(r["place"]["workflow_run_id"], []).append({**r["place"], **r})
    return list(runs.values())


def who(run: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(p["agent_id"], p["graph_node"], p["turn_id"], p["previous_agent_id"]) for p in run]


LINE = "writer/Write one line about the fact on {}, short and plain, for"
SEQUENTIAL = [
    ("researcher", "researcher/facts", 1, None),
    ("writer", LINE, 1, "researcher"),
]


def test_sequential_crew_two_kickoffs(driven: tuple[Path, str]) -> None:
    """Each task's agent by its role, the task by name or description (60 chars, whitespace
    collapsed); a kickoff the workflow, the next kickoff another; no thread, no tool time."""
    result = drive(driven, "sequential")
    runs = runs_of(result)
    assert [run[0]["workflow_run_id"] for run in runs] == result["kickoffs"]  # CrewAI's ids
    assert len(runs) == 2
    for run, topic in zip(runs, ("cats", "dogs"), strict=True):
        assert who(run) == [(a, n.format(topic), t, p) for a, n, t, p in SEQUENTIAL]
        assert {p["topic"] for p in run} == {topic}
        assert all(p["thread_id"] is None and p["tool_ms"] is None for p in run)
    assert len("Write one line about the fact on cats, short and plain, for ") == 60  # cut there


def test_kickoff_for_each(python: Path, engine: str, kvscope_path: Path, tmp_path: Path) -> None:
    """One workflow per input (CrewAI kicks a copy of the crew off for each); the driver (one
    of its own) imports crewai before watch(), which then installs at once."""
    driver = run_driver(python, engine, kvscope_path, tmp_path, ["for_each"])
    runs = runs_of(drive(driver, "for_each"))
    assert [[p["topic"] for p in run] for run in runs] == [["cats"] * 2, ["dogs"] * 2]
    for run, topic in zip(runs, ("cats", "dogs"), strict=True):
        assert who(run) == [(a, n.format(topic), t, p) for a, n, t, p in SEQUENTIAL]


def test_tool_time_charged_to_the_agents_next_call(driven: tuple[Path, str]) -> None:
    """The researcher's tool loop is one turn; its next call carries the tool's time."""
    (run,) = runs_of(drive(driven, "tools"))
    assert [p["agent_id"] for p in run][:2] == ["researcher", "researcher"]
    assert [p["turn_id"] for p in run if p["agent_id"] == "researcher"] == [1] * (len(run) - 1)
    assert run[0]["tool_ms"] is None and run[1]["tool_ms"] >= TOOL_S * 1000
    assert run[1]["previous_agent_id"] == "researcher"
    assert run[-1]["agent_id"] == "writer" and run[-1]["tool_ms"] is None


def test_hierarchical_crew_manager_delegates(driven: tuple[Path, str]) -> None:
    """The manager runs each task and delegates it (a tool): the coworker's calls are its own,
    under the delegated task; the manager's next call carries the delegation's time; each task
    is the manager's next turn."""
    (run,) = runs_of(drive(driven, "hierarchical"))
    manager = "Crew Manager"
    got = [(p["agent_id"], p["turn_id"], p["previous_agent_id"]) for p in run]
    assert got == [
        (manager, 1, None), ("researcher", 1, manager), (manager, 1, "researcher"),
        (manager, 2, manager), ("writer", 1, manager), (manager, 2, "writer"),
    ]  # fmt: skip
    assert [p["graph_node"] for p in run] == [
        f"{manager}/facts", "researcher/Help with part 0.", f"{manager}/facts",
        f"{manager}/{LINE.format('cats').split('/', 1)[1]}", "writer/Help with part 1.",
        f"{manager}/{LINE.format('cats').split('/', 1)[1]}",
    ]  # fmt: skip
    assert run[2]["tool_ms"] > 0 and run[5]["tool_ms"] > 0  # the delegations
    assert [p["tool_ms"] for p in (run[0], run[1], run[3], run[4])] == [None] * 4


@pytest.mark.parametrize(
    "pattern", ["concurrent_async", "concurrent_akickoff", "concurrent_threads"]
)
def test_two_kickoffs_at_once_keep_their_own_ids(driven: tuple[Path, str], pattern: str) -> None:
    """Two crews kicked off at once (kickoff_async under asyncio.gather; two threads): their
    calls interleave, each is named in its own kickoff (the topic in its prompt says which)."""
    result = drive(driven, pattern)
    records, runs = result["records"], runs_of(result)
    assert len(runs) == 2
    assert [r["topic"] for r in records][:2] in (["cats", "dogs"], ["dogs", "cats"])  # at once
    for run in runs:
        (topic,) = {p["topic"] for p in run}
        assert who(run) == [(a, n.format(topic), t, p) for a, n, t, p in SEQUENTIAL]


def test_reader_imports_with_the_standard_library_only(kvscope_path: Path) -> None:
    """`python -I` (no site-packages, no PYTHONPATH) with only the `kvscope` link on sys.path."""
    base = getattr(sys, "_base_executable", sys.executable)
    code = (
        f"import sys; sys.path.insert(0, {str(kvscope_path)!r}); before = set(sys.modules); "
        "import kvscope.probe.crewai as c; c.watch(); c.watch(); assert c.place() is None; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "assert new - set(sys.stdlib_module_names) == {'kvscope'}, new"
    )
    done = subprocess.run([base, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_example_app(driven: tuple[Path, str]) -> None:
    """examples/crewai_app.py, two kickoffs: researcher, writer, editor by their tasks' names."""
    result = drive(driven, "example")
    assert result["stdout"].count("[tea] ") == result["stdout"].count("[bicycles] ") == 1
    runs = runs_of(result)
    assert len(runs) == 2
    for run in runs:
        assert who(run) == [
            ("researcher", "researcher/research", 1, None),
            ("writer", "writer/write", 1, "researcher"),
            ("editor", "editor/edit", 1, "writer"),
        ]


def test_the_example_app_hierarchical(driven: tuple[Path, str]) -> None:
    """`--hierarchical`: the manager (its role, `manager`) runs each task, a turn each, and
    delegates it to a coworker (the driver scripts the delegation), whose calls are its own."""
    result = drive(driven, "example_hierarchical")
    runs = runs_of(result)
    assert len(runs) == 2
    for run in runs:
        manager = [p for p in run if p["agent_id"] == "manager"]
        assert [p["graph_node"] for p in manager][::2] == [
            "manager/research", "manager/write", "manager/edit"
        ]  # fmt: skip
        assert [p["turn_id"] for p in manager] == [1, 1, 2, 2, 3, 3]
        coworkers = [p["agent_id"] for p in run if p["agent_id"] != "manager"]
        assert sorted(coworkers) == ["editor", "researcher", "writer"]
        assert all(p["previous_agent_id"] == "manager" for p in run if p["agent_id"] != "manager")


def test_async_tasks_of_one_kickoff(driven: tuple[Path, str]) -> None:
    """Two `async_execution` tasks at once (CrewAI runs each in a thread of its own), then the
    researcher's second task: its turn 2; each call's previous agent the kickoff's last caller."""
    (run,) = runs_of(drive(driven, "concurrent_tasks"))
    first, second, last = run
    assert {first["agent_id"], second["agent_id"]} == {"researcher", "writer"}
    assert (first["turn_id"], second["turn_id"]) == (1, 1)
    assert (first["previous_agent_id"], second["previous_agent_id"]) == (None, first["agent_id"])
    assert (last["agent_id"], last["graph_node"], last["turn_id"]) == (
        "researcher", "researcher/summary", 2
    )  # fmt: skip
    assert last["previous_agent_id"] == second["agent_id"]


def test_a_kickoff_that_raises_is_an_invocation_error(driven: tuple[Path, str]) -> None:
    """A kickoff whose writer's call fails raises: the tracker hears of an invocation that
    raised, under the kickoff's workflow id and the exception's type (its trace's root is then
    ERROR); the researcher's call before it was placed in that kickoff."""
    result = drive(driven, "failing")
    (run,) = runs_of(result)
    assert run[0]["agent_id"] == "researcher" and run[-1]["agent_id"] == "writer"
    assert run[0]["workflow_run_id"] == result["kickoffs"][0]
    assert len(result["failed"]) == 1
    assert [(e["workflow_run_id"], e["error_type"]) for e in result["errors"]] == [
        (result["kickoffs"][0], result["failed"][0])
    ]
    assert "connect" in result["errors"][0]["error_message"].lower()  # the raised message
