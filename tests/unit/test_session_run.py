"""A session's MLflow run opens where MLflow is loaded already, and otherwise at the session's
close, started at the session's start, with every param given meanwhile (session_run.py). The
deferred path is run in a fresh interpreter: this one has MLflow loaded by other tests."""

import json
import subprocess
import sys
from pathlib import Path

from mlflow import MlflowClient

from kvscope.probe.mlflow_store import local_store_uri

SCRIPT = r"""
import json, sys, time
from pathlib import Path
from kvscope.config import ExperimentConfig
from kvscope.session_run import SessionRun

stages = []
cfg = ExperimentConfig(runs_dir=Path(sys.argv[1]))
mlrun = SessionRun(cfg, "bench-1", "vllm", stages.append, stages.append)
before = time.time() * 1000
mlrun.open({"a": 1})
loaded_while_open = "mlflow" in sys.modules
mlrun.log_params({"b": "two"})
time.sleep(0.3)
opened_at = time.time() * 1000
mlrun.ensure()
mlrun.ensure()  # once
t = mlrun.tracking
print(json.dumps({"loaded_while_open": loaded_while_open, "before": before,
                  "opened_at": opened_at, "run_id": t.run_id, "stages": stages}))
"""


def test_a_process_without_mlflow_opens_the_run_at_the_end_started_at_the_start(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["loaded_while_open"] is False  # no MLflow in the process until ensure()
    assert got["stages"] == ["opening the MLflow run"]
    run = MlflowClient(local_store_uri(tmp_path)).get_run(got["run_id"])
    assert got["before"] - 1 <= run.info.start_time < got["opened_at"]  # the session's start
    assert run.data.params == {"a": "1", "b": "two"}
    assert run.data.tags["benchmark_run_id"] == "bench-1"
    assert run.info.run_name == "bench-1"


def test_a_process_with_mlflow_opens_the_run_at_once(tmp_path: Path) -> None:
    from kvscope.config import ExperimentConfig
    from kvscope.session_run import SessionRun

    stages: list[str] = []
    mlrun = SessionRun(ExperimentConfig(runs_dir=tmp_path), "b-2", "vllm", stages.append, print)
    mlrun.open({"a": 1})
    try:
        assert mlrun.tracking is not None and mlrun.tracking.run_id is not None
        mlrun.log_params({"b": 2})
        run = MlflowClient(local_store_uri(tmp_path)).get_run(mlrun.tracking.run_id)
        assert run.data.params == {"a": "1", "b": "2"} and stages == ["opening the MLflow run"]
    finally:
        import mlflow

        mlflow.end_run()


def test_an_offline_run_opens_nothing(tmp_path: Path) -> None:
    from kvscope.config import ExperimentConfig
    from kvscope.session_run import SessionRun

    warned: list[str] = []
    mlrun = SessionRun(ExperimentConfig(runs_dir=tmp_path), "b-3", "vllm", print, warned.append)
    mlrun.go_offline("MLflow at http://x is unreachable")
    mlrun.open({"a": 1})
    mlrun.ensure()
    assert mlrun.tracking is None and warned == ["MLflow at http://x is unreachable"]
    assert not (tmp_path / "mlflow.db").exists()
