"""`kvscope profile`'s program side, without an engine: the probe loaded by sitecustomize into a
real child interpreter (its calls answered by the stand-in vLLM), part files merged, exit codes
passed through, and the profile's configuration."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

from kvscope.cli.profile import _default_name
from kvscope.config import EngineConfig
from kvscope.errors import ConfigError
from kvscope.probe import child
from kvscope.probe.streams import merge_parts
from kvscope.probe.wire import RunInfo
from kvscope.profiling import profile_config, run_program
from kvscope.records.base import read_jsonl
from kvscope.records.payloads import PAYLOADS_JSONL
from kvscope.records.requests import REQUESTS_JSONL
from kvscope.records.tools import TOOLS_JSONL

TESTS = ROOT / "tests"

APP = textwrap.dedent(
    """
    import multiprocessing, os, sys
    import httpx2, openai
    from langchain_core.tools import tool
    from langgraph.graph import END, START, StateGraph
    from typing import TypedDict
    from vllm_stub import Stub

    client = openai.OpenAI(http_client=httpx2.Client(transport=Stub().transport(httpx2)))
    MODEL = os.environ["KVSCOPE_MODEL"]

    @tool
    def lookup(q: str) -> str:
        "Look something up."
        return q.upper()

    def ask(text):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=4)

    class S(TypedDict):
        n: int

    def planner(s):
        ask("plan")
        return {"n": s["n"] + 1}

    def executor(s):
        lookup.invoke({"q": "x"})
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "do"}], stream=True)
        print("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        return {"n": s["n"] + 1}

    def forked():
        ask("from a worker")

    if __name__ == "__main__":
        g = StateGraph(S)
        g.add_node("planner", planner)
        g.add_node("executor", executor)
        g.add_edge(START, "planner")
        g.add_edge("planner", "executor")
        g.add_edge("executor", END)
        g.compile().invoke({"n": 0}, {"configurable": {"thread_id": "t1"}})
        worker = multiprocessing.get_context("fork").Process(target=forked)
        worker.start()
        worker.join()
        print("app done", file=sys.stderr)
        sys.exit(7)
    """
)


def spec(run_dir: Path) -> child.ChildSpec:
    run = RunInfo("bench-1", "exp", "hash", "app", None, "smollm2", None)
    engine = EngineConfig().model_dump(mode="json")
    return child.ChildSpec(run, engine, "http://engine:8000/v1", str(run_dir), None, False, True)


def child_env(run_dir: Path, **extra: str) -> dict[str, str]:
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *extra.pop("path", [])])}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "environ", base)
        added = child.environment(spec(run_dir), "smollm2", None)
    return {**base, **added, **extra}


def test_an_unmodified_program_leaves_one_row_per_call(tmp_path: Path) -> None:
    theirs = tmp_path / "site"  # the program's own sitecustomize, which kvscope's shadows
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        f"open({str(tmp_path / 'theirs-ran')!r}, 'a').write('x')\n"
    )
    env = child_env(tmp_path, path=[str(theirs)])
    assert env["OPENAI_BASE_URL"] == "http://engine:8000/v1" and env["KVSCOPE_MODEL"] == "smollm2"
    (tmp_path / "app.py").write_text(APP)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "app.py")],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 7, done.stderr  # the program's own status
    assert "app done" in done.stderr and "kvscope" not in done.stderr
    assert done.stdout.strip()  # the streamed reply reached the app
    assert (tmp_path / "theirs-ran").exists()
    assert len(child.attached_processes(tmp_path)) == 2  # the program and its forked worker

    assert merge_parts(tmp_path) >= 3
    rows, torn = read_jsonl(tmp_path / REQUESTS_JSONL)
    assert torn == 0 and not list(tmp_path.glob(f"{REQUESTS_JSONL}.*"))
    by_agent = {r["agent_id"]: r for r in rows}
    assert set(by_agent) == {"planner", "executor", None}  # the worker's call has no agent
    planner, executor = by_agent["planner"], by_agent["executor"]
    assert planner["workflow_run_id"] == executor["workflow_run_id"] is not None
    assert executor["previous_agent_id"] == "planner" and planner["thread_id"] == "t1"
    assert executor["tool_ms"] is not None and executor["ttft_ms"] is not None
    assert all(r["benchmark_run_id"] == "bench-1" and r["status"] == "ok" for r in rows)
    assert all(r["prompt_tokens"] is not None for r in rows)
    tools = read_jsonl(tmp_path / TOOLS_JSONL)[0]
    assert [t["name"] for t in tools] == ["lookup"]
    payloads = read_jsonl(tmp_path / PAYLOADS_JSONL)[0]
    assert {p["request_uuid"] for p in payloads} == {r["request_uuid"] for r in rows}


def test_a_probe_that_cannot_load_leaves_the_program_running(tmp_path: Path) -> None:
    env = child_env(tmp_path, KVSCOPE_CAPTURE=str(tmp_path / "missing.json"))
    done = subprocess.run(
        [sys.executable, "-c", "print('still here')"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "still here\n"
    assert "kvscope: the probe did not load" in done.stderr
    assert child.attached_processes(tmp_path) == []


def test_the_programs_exit_status_passes_through() -> None:
    assert run_program([sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ)) == (
        3,
        None,
    )
    code, failure = run_program(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
        dict(os.environ),
    )
    assert code == 143 and failure is None
    with pytest.raises(ConfigError, match="cannot run"):
        run_program(["/no/such/program"], dict(os.environ))


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "examples/peer.py", "--n", "2"], "peer"),
        (["python3", "-m", "pkg.my_app"], "my_app"),
        (["./serve_agents.py"], "serve-agents"),
        (["uv", "run", "app"], "uv"),
    ],
)
def test_the_run_is_named_after_the_script(command: list[str], name: str) -> None:
    assert _default_name(command) == name


def test_the_profile_config_takes_an_engine_file_an_experiment_or_a_url(tmp_path: Path) -> None:
    engine = tmp_path / "engine.yaml"
    engine.write_text(yaml.safe_dump({"kind": "vllm", "kv_capacity_tokens": 4096}))
    cfg = profile_config("app", engine, command=("python", "app.py"))
    assert cfg.engine.kv_capacity_tokens == 4096 and cfg.app is not None
    assert cfg.app.command == ("python", "app.py") and cfg.app.workflow_type == "app"

    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {"name": "x", "engine": {"port": 8100}, "cold_start": False,
             "workload": {"workflows": 9}, "tracking": {"experiment": "mine"}}
        )
    )  # fmt: skip
    cfg = profile_config("app", experiment, traces=False)
    assert cfg.engine.port == 8100 and not cfg.cold_start and cfg.name == "app"
    assert cfg.tracking.experiment == "mine" and not cfg.tracking.traces

    cfg = profile_config(attach="http://gpu-box:30000")
    assert cfg.engine.kind == "attach" and cfg.engine.url == "http://gpu-box:30000"
    with pytest.raises(ConfigError, match="not both"):
        profile_config(engine=engine, attach="http://x")
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"kind": "nonsense"}))
    with pytest.raises(ConfigError, match="kind"):
        profile_config(engine=bad)
