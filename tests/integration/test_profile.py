"""Profiling apps nobody wrote for kvscope, on the real engine: `kvscope profile -- python ...`
with the shipped examples, and `with kvscope.profile(...)` in a script and in a running loop."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, TypedDict

import pyarrow.parquet as pq
import pytest
from framework_venv import framework_python
from helpers import KVSCOPE, ROOT, Up
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import kvscope
from kvscope.records.requests import PROVENANCE_COLUMNS
from kvscope.records.tokens import TOKENS_ARROW, load_tokens

pytestmark = pytest.mark.engine


def profile_cli(
    up: Up, tmp_path: Path, *program: str, timeout: float = 900
) -> tuple[subprocess.CompletedProcess[str], Path]:
    runs = tmp_path / "runs"
    argv = [*KVSCOPE, "profile", "--engine", str(up.engine_file(tmp_path)),
            "--runs-dir", str(runs), "--", *program]  # fmt: skip
    done = subprocess.run(
        argv, env=up.env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )
    dirs = list(runs.glob("*/run.json")) if runs.exists() else []
    assert len(dirs) == 1, done.stdout + done.stderr
    return done, dirs[0].parent


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    return sorted(pq.read_table(run_dir / "requests.parquet").to_pylist(),
                  key=lambda r: r["start_ns"])  # fmt: skip


@pytest.fixture(scope="module")
def supervisor(up: Up, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The supervisor example profiled from a virtualenv of the app's own that has LangGraph
    but not kvscope (the lite probe: the calls recorded there, made rows here by the same code
    as kvscope's own probe; the identity read by the same identity.py). kvscope's own probe
    runs the other examples below."""
    python = str(framework_python("langgraph"))
    assert subprocess.run([python, "-c", "import kvscope"], capture_output=True).returncode
    tmp = tmp_path_factory.mktemp("supervisor")
    program = (python, str(ROOT / "examples" / "supervisor.py"), "--topics", "1")
    done, run_dir = profile_cli(up, tmp, *program)
    probes = {json.loads(p.read_text()).get("probe") for p in run_dir.glob("probe.*.json")}
    assert probes == {"lite"}, probes
    return {"done": done, "run_dir": run_dir, "rows": rows_of(run_dir)}


def test_profile_passes_the_programs_output_and_status(supervisor: dict[str, Any]) -> None:
    done = supervisor["done"]
    assert done.returncode == 0, done.stderr
    assert "[tides] Why do tides happen?" in done.stdout  # the program's own output, on stdout
    assert "per agent" not in done.stdout and "per agent" in done.stderr  # kvscope's: stderr
    assert "reconcile cached_tokens_total" in done.stderr and "exact" in done.stderr
    assert "traces: 2 written of 2 workflows" in done.stderr  # one per invocation


def test_profile_names_calls_by_the_apps_own_graph(supervisor: dict[str, Any]) -> None:
    rows = supervisor["rows"]
    assert all(r["status"] == "ok" and r["workflow_type"] == "supervisor" for r in rows)
    agents = {r["agent_id"] for r in rows}
    assert {"supervisor", "critic"} <= agents <= {"supervisor", "researcher", "writer", "critic"}
    invocations = sorted({r["workflow_run_id"] for r in rows}, key=lambda w: min(
        r["start_ns"] for r in rows if r["workflow_run_id"] == w))  # fmt: skip
    assert len(invocations) == 2 and all(r["thread_id"] == "topic-tides" for r in rows)
    for turn, invocation in enumerate(invocations, 1):
        mine = [r for r in rows if r["workflow_run_id"] == invocation]
        assert {r["thread_turn"] for r in mine} == {turn}
        assert mine[0]["agent_id"] == "supervisor" and mine[0]["previous_agent_id"] is None
        sup = [r["turn_id"] for r in mine if r["agent_id"] == "supervisor"]
        assert sup == list(range(1, len(sup) + 1))  # the supervisor's visits, in order
        critics = [r for r in mine if r["agent_id"] == "critic"]
        assert len(critics) == 2  # the Send fan-out: two parallel branches ...
        assert {r["previous_agent_id"] for r in critics} == {"supervisor"}  # ... after it
    research = [r for r in rows if r["agent_id"] == "researcher"]
    assert all(r["graph_node"] == "researcher/draft" for r in research)  # the subgraph's node
    assert all(r["tool_ms"] is not None for r in research)  # its lookup tool ran before
    writer = [r for r in rows if r["agent_id"] == "writer"]
    assert all(r["ttft_ms"] is not None for r in writer)  # streamed: TTFT from the stream
    assert all(r["ttft_ms"] is None for r in rows if r["agent_id"] == "supervisor")  # not


def test_profile_measures_reuse_and_provenance(supervisor: dict[str, Any]) -> None:
    rows, run_dir = supervisor["rows"], supervisor["run_dir"]
    second = [r for r in rows if r["thread_turn"] == 2 and r["agent_id"] == "supervisor"]
    assert sum(r["cached_tokens"] for r in second) > 0  # the thread's history is reused
    for r in rows:
        assert r["prompt_token_source"] in ("engine", "tokenizer")
        assert r["prompt_token_mismatch"] is False
        measured = [r[c] for c in PROVENANCE_COLUMNS]
        assert None not in measured and sum(measured) == r["prompt_tokens"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary and (run_dir / "report.html").exists()


def test_profile_the_peer_example_as_an_app(up: Up, tmp_path: Path) -> None:
    """The shipped PEER app run by `kvscope profile`, as a user's program: its own agents, the
    PEER cycle as turn, its annotations from node metadata, one trace per invocation."""
    done, run_dir = profile_cli(up, tmp_path, sys.executable, str(ROOT / "examples" / "peer.py"),
                                "1", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "peer: 1 workflows, 8 calls, 2 cycles, 0 failed" in done.stdout
    rows = rows_of(run_dir)
    agents = ["planner", "executor", "expresser", "reviewer"]
    assert [r["agent_id"] for r in rows] == agents * 2
    assert [r["turn_id"] for r in rows] == [1] * 4 + [2] * 4
    assert [r["previous_agent_id"] for r in rows] == [None, *agents, *agents[:3]]
    assert all(r["prompt_template_version"] and r["prompt_layout"] == "shared-first" for r in rows)
    assert all(r["fixed_prefix_tokens"] for r in rows)  # from the fixed_messages annotation
    assert {r["tool_ms"] is not None for r in rows if r["agent_id"] == "executor"} == {True}
    assert "traces: 1 written of 1 workflows" in done.stderr


def test_profile_attached_to_a_server_kvscope_did_not_start(up: Up, tmp_path: Path) -> None:
    """`--attach URL`: detection names the server vLLM, so the program's calls carry vLLM's
    request ids and bring back their prompt ids (kept: prompt_tokens.arrow, the divergence
    columns), and its cache is emptied first as a launched vLLM's is."""
    runs = tmp_path / "runs"
    argv = [*KVSCOPE, "profile", "--attach", up.base, "--runs-dir", str(runs), "--",
            sys.executable, str(ROOT / "examples" / "peer.py"), "1", "1"]  # fmt: skip
    done = subprocess.run(
        argv, env=up.env, capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [p.parent for p in runs.glob("*/run.json")]
    rows = rows_of(run_dir)
    assert len(rows) == 8 and all(r["prompt_token_source"] == "engine" for r in rows)
    assert len(load_tokens(run_dir)) == 8 and (run_dir / TOKENS_ARROW).exists()
    assert all(r["first_divergence_previous_agent"] is not None for r in rows[1:])
    run = json.loads((run_dir / "run.json").read_text())
    assert run["launch_command"] is None  # attached: nothing started
    assert run["cache_reset"] == "emptied before the workload"
    assert rows[0]["cached_tokens"] == 0  # the reset left the cache cold


def test_an_app_that_traces_itself_gets_kvscopes_numbers_on_its_own_trace(
    up: Up, tmp_path: Path
) -> None:
    """mlflow.langchain.autolog() in the profiled program: its trace (in kvscope's store, linked
    to the run) carries kvscope's measurements; kvscope writes no second trace."""
    app = tmp_path / "autologged.py"
    app.write_text(textwrap.dedent(
        """
        import os, mlflow
        from langchain_openai import ChatOpenAI
        from langgraph.graph import END, START, StateGraph
        from typing import TypedDict

        mlflow.langchain.autolog()
        llm = ChatOpenAI(model=os.environ["KVSCOPE_MODEL"], max_tokens=4, temperature=0)

        class S(TypedDict):
            text: str

        def planner(s):
            return {"text": llm.invoke("Plan: " + s["text"]).content}

        def writer(s):
            return {"text": llm.invoke("Write: " + s["text"]).content}

        g = StateGraph(S)
        g.add_node("planner", planner)
        g.add_node("writer", writer)
        g.add_edge(START, "planner")
        g.add_edge("planner", "writer")
        g.add_edge("writer", END)
        g.compile().invoke({"text": "tea"}, {"configurable": {"thread_id": "t1"}})
        mlflow.flush_trace_async_logging()
        """
    ))  # fmt: skip
    done, run_dir = profile_cli(up, tmp_path, sys.executable, str(app))
    assert done.returncode == 0, done.stderr
    rows = rows_of(run_dir)
    assert [r["agent_id"] for r in rows] == ["planner", "writer"]
    (trace_id,) = {r["mlflow_trace_id"] for r in rows}
    assert trace_id and "traces: 1 written of 1 workflows" in done.stderr
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{run_dir.parent / 'mlflow.db'}")
    trace = client.get_trace(trace_id)
    llm_spans = [s for s in trace.data.spans if s.attributes.get("agent.id")]
    assert sorted(s.attributes["agent.id"] for s in llm_spans) == ["planner", "writer"]
    assert all(s.attributes.get("gen_ai.usage.input_tokens") for s in llm_spans)


def test_profile_keeps_a_crashing_programs_calls(up: Up, tmp_path: Path) -> None:
    app = tmp_path / "crash.py"
    app.write_text(textwrap.dedent(
        """
        import os, openai
        client = openai.OpenAI()
        client.completions.create(model=os.environ["KVSCOPE_MODEL"], prompt="Hi", max_tokens=4)
        raise SystemExit("boom")
        """
    ))  # fmt: skip
    done, run_dir = profile_cli(up, tmp_path, sys.executable, str(app))
    assert done.returncode == 1 and "boom" in done.stderr
    assert "the program exited with status 1" in done.stderr
    (row,) = rows_of(run_dir)
    assert row["status"] == "ok" and row["agent_id"] is None and row["output_tokens"] == 4


def test_ctrl_c_keeps_what_was_measured(up: Up, tmp_path: Path) -> None:
    app = tmp_path / "slow.py"
    app.write_text(textwrap.dedent(
        """
        import os, time, openai
        client = openai.OpenAI()
        client.chat.completions.create(model=os.environ["KVSCOPE_MODEL"], max_tokens=4,
                                       messages=[{"role": "user", "content": "Hi"}])
        print("called", flush=True)
        time.sleep(600)
        """
    ))  # fmt: skip
    runs = tmp_path / "runs"
    argv = [*KVSCOPE, "profile", "--engine", str(up.engine_file(tmp_path)),
            "--runs-dir", str(runs), "--", sys.executable, str(app)]  # fmt: skip
    proc = subprocess.Popen(argv, env=up.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 600
    while proc.stdout.readline().strip() != "called":
        assert time.monotonic() < deadline and proc.poll() is None
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole process group
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    (run_dir,) = [p.parent for p in runs.glob("*/run.json")]
    (row,) = rows_of(run_dir)
    assert row["status"] == "ok" and (run_dir / "report.html").exists()
    assert "stopped early" in out + err


class Two(TypedDict):
    text: str


def two_agents(llm: ChatOpenAI, asynchronous: bool) -> Any:
    """planner -> writer; the writer async when `asynchronous` (then the graph needs ainvoke)."""

    def planner(state: Two) -> dict[str, str]:
        return {"text": str(llm.invoke(f"Plan: {state['text']}").content)}

    def sync_writer(state: Two) -> dict[str, str]:
        return {"text": str(llm.invoke(f"Write: {state['text']}").content)}

    async def async_writer(state: Two) -> dict[str, str]:
        return {"text": str((await llm.ainvoke(f"Write: {state['text']}")).content)}

    writer = async_writer if asynchronous else sync_writer

    g = StateGraph(Two)
    g.add_node("planner", planner)
    g.add_node("writer", writer)
    g.add_edge(START, "planner")
    g.add_edge("planner", "writer")
    g.add_edge("writer", END)
    return g.compile()


@pytest.mark.usefixtures("engine_state")
def test_library_profile_in_a_plain_script(up: Up, tmp_path: Path) -> None:
    with kvscope.profile(name="lib", engine=up.engine_file(tmp_path),
                         runs_dir=tmp_path / "runs") as run:  # fmt: skip
        assert os.environ["OPENAI_BASE_URL"] == run.base_url
        llm = ChatOpenAI(model=run.model, max_tokens=4, temperature=0)  # from the environment
        graph = two_agents(llm, asynchronous=False)
        graph.invoke({"text": "tea"}, {"configurable": {"thread_id": "a"}})
        with kvscope.agent("outside"):
            llm.invoke("Hello")
    assert "OPENAI_BASE_URL" not in os.environ or os.environ["OPENAI_BASE_URL"] != run.base_url
    rows = rows_of(run.run_dir)
    assert [r["agent_id"] for r in rows] == ["planner", "writer", "outside"]
    assert rows[1]["previous_agent_id"] == "planner" and rows[2]["workflow_run_id"] is None
    assert run.requests().num_rows == 3
    assert run.outcome is not None and run.outcome.analysis.rows == 3
    assert all(r.exact for r in run.outcome.analysis.reconciliation if r.exact is not None)


@pytest.mark.usefixtures("engine_state")
def test_library_profile_inside_a_running_event_loop(up: Up, tmp_path: Path) -> None:
    async def main() -> kvscope.Profile:
        async with kvscope.profile(name="loop", engine=up.engine_file(tmp_path),
                                   runs_dir=tmp_path / "runs") as run:  # fmt: skip
            llm = ChatOpenAI(model=run.model, max_tokens=4, temperature=0)
            graph = two_agents(llm, asynchronous=True)
            await asyncio.gather(*(
                graph.ainvoke({"text": t}, {"configurable": {"thread_id": t}})
                for t in ("tea", "coffee")
            ))  # fmt: skip
        return run

    run = asyncio.run(main())
    rows = rows_of(run.run_dir)
    assert len(rows) == 4 and {r["thread_id"] for r in rows} == {"tea", "coffee"}
    for thread in ("tea", "coffee"):
        mine = [r for r in rows if r["thread_id"] == thread]
        assert [r["agent_id"] for r in mine] == ["planner", "writer"]
        assert len({r["workflow_run_id"] for r in mine}) == 1
