"""The engine SIGKILLed in the middle of `kvscope run` (its server, or its worker process alone):
the run stops sending, keeps a row for every request it sent, says in its output, run.json,
summary.json and MLflow that the engine died (when, after how many calls, what was not run),
exits non-zero, and `kvscope report` works on what was kept.

The server case runs against an engine that demands an API key (named by engine.api_key_env):
kvscope sends the key with every request it makes, launches the engine with it in its
environment only, and writes it nowhere, a crashed run included: no file of the run, the MLflow
store or kvscope's state holds it, nor any command line. (It had an engine of its own before.)

Each case starts its own engine (kvscope run, a port of its own): the session's engine is never
killed. About a minute each on a 2-core machine.
"""

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import httpx
import mlflow
import psutil
import pytest
import yaml
from helpers import KVSCOPE, ROOT, free_port

pytestmark = pytest.mark.engine
WORKFLOWS = 8
KILL_AFTER = 3  # rows


def engine_process(kvscope: psutil.Process, target: str) -> psutil.Process:
    """The engine's server (the process kvscope launched) or its worker (EngineCore)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for p in kvscope.children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
                name = p.name()
            except psutil.Error:
                continue
            if target == "server" and "vllm.entrypoints" in cmd:
                return p
            if target == "worker" and ("EngineCore" in name or "EngineCore" in cmd):
                return p
        time.sleep(0.5)
    raise AssertionError(f"no engine {target} process under kvscope")


@pytest.mark.parametrize("target", ["server", "worker"])
def test_a_killed_engine_ends_the_run_cleanly(tmp_path: Path, target: str) -> None:
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["engine"] |= {"port": free_port(), "kv_events_port": free_port(2)}
    cfg["workload"] |= {"workflows": WORKFLOWS, "concurrency": 1, "cycles": 1, "max_tokens": 16}
    cfg["runs_dir"] = str(tmp_path / "runs")
    key = f"kvs-{secrets.token_hex(16)}" if target == "server" else None
    if key:
        cfg["engine"]["api_key_env"] = "KVS_TEST_KEY"
    config = tmp_path / "faults.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "KVSCOPE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    env.pop("KVSCOPE_API_KEY", None)
    env |= {"KVS_TEST_KEY": key} if key else {}
    refused: int | None = None
    cmdlines: list[str] = []
    proc = subprocess.Popen([*KVSCOPE, "run", str(config)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        rows_file = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list((tmp_path / "runs").glob("*/requests.jsonl"))
            if found and len(found[0].read_text().splitlines()) >= KILL_AFTER:
                rows_file = found[0]
                break
            time.sleep(0.2)
        assert rows_file is not None, "no rows before the deadline"
        victim = engine_process(psutil.Process(proc.pid), target)
        if key:  # the engine is up: without the key it must refuse
            port = cfg["engine"]["port"]
            refused = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code
            for p in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    cmdlines.append(" ".join(p.cmdline()))
        killed_ns = time.time_ns()
        victim.send_signal(signal.SIGKILL)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode not in (0, None), output
    run_dir = rows_file.parent
    assert "the engine died" in output, output

    status = json.loads((run_dir / "run.json").read_text())["status"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == status and status["state"] == "engine_died"
    assert status["workflows_planned"] == WORKFLOWS and status["workflows_not_run"] >= 1
    assert status["calls_before_engine_death"] >= KILL_AFTER - 1
    # every request sent is one row; none after the death but the ones that failed on it
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len({r["request_uuid"] for r in rows}) == len(rows) == status["calls"]
    late = [r for r in rows if r["end_ns"] > killed_ns + 5e9]
    assert all(r["status"] != "ok" for r in late)
    assert status["failed_calls"] == sum(r["status"] != "ok" for r in rows) >= 1

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    [run] = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "FAILED" and run.data.tags["kvscope.status"] == "engine_died"

    report = subprocess.run([*KVSCOPE, "report", str(run_dir)], env=env, text=True,
                            capture_output=True, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stdout + report.stderr
    assert (run_dir / "report.html").exists()
    if key:
        assert refused == 401, "the engine did not demand the key"
        assert sum(r["status"] == "ok" for r in rows) >= KILL_AFTER  # the key was sent
        assert cmdlines and not any(key in c for c in cmdlines)
        assert key not in output + report.stdout + report.stderr
        holders = [
            p for p in tmp_path.rglob("*")
            if p.is_file() and p != config and key.encode() in p.read_bytes()
        ]  # fmt: skip
        assert holders == []
        assert "KVS_TEST_KEY" in (run_dir / "config.yaml").read_text()  # only the variable's name
    left = [p for p in psutil.Process().children(recursive=True) if "vllm" in " ".join(p.cmdline())]
    assert not left
