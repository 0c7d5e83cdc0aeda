"""Experiments from several machines into one MLflow tracking server with a database backend.

A real `mlflow server` (SQLite backend store, a server-side artifact store served through the
server: `--artifacts-destination`) and two run directories kept on two "machines" (two
directories, each uploaded by its own `kvscope log RUN --tracking-uri http://...` process with
its own working directory): both land in the one experiment, with their metrics, artifacts and
traces, and the artifacts are on the server's side, not the machines'.
"""

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import KVSCOPE, ROOT, free_port
from mlflow import MlflowClient

from kvscope.finalize import finalize

RUNS = ["fixture-20261123-190150-e19295", "fixture-pressure-20261123-190437-ee5775"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`mlflow server` on SQLite, as the README's multi-machine setup starts it."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    argv = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server did not answer in 120 s"
            time.sleep(0.5)
        yield uri, root
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def machine(tmp_path: Path, name: str, run: str) -> Path:
    """A run directory as another machine kept it (finalized locally)."""
    run_dir = tmp_path / name / "runs" / run
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / run, run_dir)
    finalize(run_dir)
    return run_dir


def test_two_machines_log_into_one_server(server: tuple[str, Path], tmp_path: Path) -> None:
    uri, root = server
    db = root / "mlflow.db"
    size_before = db.stat().st_size
    dirs = [machine(tmp_path, f"machine{i}", run) for i, run in enumerate(RUNS)]
    for run_dir in dirs:
        result = subprocess.run(
            [*KVSCOPE, "log", str(run_dir), "--tracking-uri", uri], cwd=run_dir.parent.parent,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    client = MlflowClient(uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string="tags.`kvscope.logged` = 'true'",
    )
    assert sorted(r.data.tags["benchmark_run_id"] for r in runs) == RUNS
    assert len({r.info.experiment_id for r in runs}) == 1  # one experiment for both machines
    for r in runs:
        assert r.data.metrics["all.calls"] == 8.0
        names = {a.path for a in client.list_artifacts(r.info.run_id)}
        assert {"requests.parquet", "summary.json", "report.html"} <= names
        assert r.info.artifact_uri.startswith("mlflow-artifacts:")  # served by the server
        traces = client.search_traces(locations=[r.info.experiment_id], run_id=r.info.run_id)
        assert len(traces) == 2  # one per workflow
    assert db.stat().st_size > size_before  # the database backend holds them
    stored = {p.name for p in (root / "artifacts").rglob("*") if p.is_file()}
    assert {"requests.parquet", "report.html"} <= stored  # on the server's side
    for run_dir in dirs:  # and no machine kept a store of its own
        assert not (run_dir.parent / "mlflow.db").exists()
