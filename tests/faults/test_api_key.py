"""An engine that demands an API key: kvscope sends the key (named by engine.api_key_env) with
every request it makes, launches the engine with it in its environment only, and writes it
nowhere: no file of the run, the MLflow store or kvscope's state holds it, nor the engine's
command line. One engine start (about a minute on a 2-core machine)."""

import contextlib
import os
import secrets
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import KVSCOPE, ROOT, free_port

pytestmark = pytest.mark.engine


def test_the_key_is_sent_and_written_nowhere(tmp_path: Path) -> None:
    key = f"kvs-{secrets.token_hex(16)}"
    port = free_port()
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["engine"] |= {"port": port, "kv_events_port": free_port(2), "api_key_env": "KVS_TEST_KEY"}
    cfg["workload"] |= {"workflows": 1, "concurrency": 1, "cycles": 1, "max_tokens": 8}
    cfg["runs_dir"] = str(tmp_path / "runs")
    config = tmp_path / "keyed.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "KVS_TEST_KEY": key, "KVSCOPE_STATE_DIR": str(tmp_path / "state")}
    env.pop("OPENAI_API_KEY", None)
    env.pop("KVSCOPE_API_KEY", None)
    proc = subprocess.Popen([*KVSCOPE, "run", str(config)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    refused = None
    cmdlines: list[str] = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and refused is None:
            try:  # the engine is up once it answers; without the key it must refuse
                refused = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code
            except httpx.HTTPError:
                time.sleep(1)
        for p in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmdlines.append(" ".join(p.cmdline()))
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert refused == 401, "the engine did not demand the key"
    assert proc.returncode == 0, output
    (run_dir,) = (tmp_path / "runs").glob("demo-*")
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)  # the key was sent
    assert cmdlines and not any(key in c for c in cmdlines)
    assert key not in output
    holders = [
        p for p in tmp_path.rglob("*")
        if p.is_file() and p != config and key.encode() in p.read_bytes()
    ]  # fmt: skip
    assert holders == []
    assert "KVS_TEST_KEY" in (run_dir / "config.yaml").read_text()  # only the variable's name
