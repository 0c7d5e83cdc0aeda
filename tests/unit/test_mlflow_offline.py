"""A run is local-first: an MLflow server that does not answer is found out in seconds (never
minutes of the client's retries), the run is written in full without it, and `kvscope log RUN`
uploads it afterwards, once (a second upload writes nothing; one cut off midway is replaced)."""

import json
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import ROOT, free_port
from mlflow import MlflowClient
from typer.testing import CliRunner

from kvscope import upload as upload_module
from kvscope.analysis.run import analyze_run
from kvscope.cli import app
from kvscope.finalize import finalize
from kvscope.probe.tracing import local_store_uri, unreachable
from kvscope.publish import WorkloadOutcome, publish
from kvscope.upload import upload

RUN = "fixture-20261123-190150-e19295"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / RUN
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, path)
    finalize(path)
    return path


@pytest.fixture
def health_503() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_a_server_that_is_down_is_found_out_in_seconds(health_503: str) -> None:
    t0 = time.monotonic()
    problem = unreachable(f"http://127.0.0.1:{free_port()}")
    assert problem is not None and "unreachable" in problem and time.monotonic() - t0 < 5
    assert "HTTP 503" in (unreachable(health_503) or "")
    assert unreachable("sqlite:///anywhere.db") is None  # a local store is not checked


def test_without_mlflow_the_run_is_written_in_full(run_dir: Path) -> None:
    outcome = publish(analyze_run(run_dir), None, WorkloadOutcome(), offline="MLflow is down")
    assert outcome.mlflow_error == "MLflow is down" and outcome.mlflow_run_id is None
    assert (run_dir / "summary.json").exists() and (run_dir / "report.html").exists()
    record = json.loads((run_dir / "run.json").read_text())["mlflow"]
    assert (record["logged"], record["reason"]) == (False, "MLflow is down")


class Failing:
    """A TrackingRun whose server dies after the run was opened."""

    run_id, tracking_uri = "r1", "sqlite:///x.db"

    def log_metrics(self, metrics: object) -> None:
        raise ConnectionError("the tracking server went away")


def test_mlflow_failing_at_publish_loses_nothing_and_raises_nothing(run_dir: Path) -> None:
    outcome = publish(analyze_run(run_dir), Failing(), WorkloadOutcome(), traces=False)  # type: ignore[arg-type]
    assert outcome.mlflow_error and "went away" in outcome.mlflow_error
    assert (run_dir / "report.html").exists()
    assert json.loads((run_dir / "run.json").read_text())["mlflow"]["logged"] is False


def runs_of(run_dir: Path) -> list:
    client = MlflowClient(local_store_uri(run_dir.parent))
    return client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        f"tags.benchmark_run_id = '{RUN}'",
    )


def test_log_uploads_a_run_once(run_dir: Path) -> None:
    first = upload(run_dir)
    assert not first.already
    [run] = runs_of(run_dir)
    assert run.info.run_id == first.run_id and run.data.tags["kvscope.logged"] == "true"
    assert run.data.metrics["all.calls"] == 8.0
    client = MlflowClient(local_store_uri(run_dir.parent))
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=first.run_id)
    assert len(traces) == 2  # one per workflow
    assert json.loads((run_dir / "run.json").read_text())["mlflow"]["run_id"] == first.run_id
    again = CliRunner().invoke(app, ["log", str(run_dir)])
    assert again.exit_code == 0 and "already logged" in again.output
    assert len(runs_of(run_dir)) == 1


def test_a_cut_off_upload_is_replaced_with_every_trace_it_had(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The traces of a run cut off mid-upload are all deleted, however many pages they fill
    (the search once stopped at 10,000: a larger run's upload left the rest behind)."""
    first = upload(run_dir)
    client = MlflowClient(local_store_uri(run_dir.parent))
    [run] = runs_of(run_dir)
    exp = run.info.experiment_id
    assert len(client.search_traces(locations=[exp], run_id=first.run_id)) == 2
    client.set_tag(first.run_id, "kvscope.logged", "false")  # as if cut off before the end
    monkeypatch.setattr(upload_module, "PAGE", 1)  # two traces: two pages
    done = upload(run_dir)
    assert done.replaced == 1 and done.run_id != first.run_id
    assert client.search_traces(locations=[exp], run_id=first.run_id) == []
    assert len(client.search_traces(locations=[exp], run_id=done.run_id)) == 2


def test_log_replaces_an_upload_that_was_cut_off(run_dir: Path) -> None:
    client = MlflowClient(local_store_uri(run_dir.parent))
    # an explicit artifact root: the default is ./mlruns of the cwd
    exp = client.create_experiment("fixture", (run_dir.parent / "mlartifacts").as_uri())
    cut = client.create_run(exp, tags={"benchmark_run_id": RUN}).info.run_id  # no logged tag
    done = upload(run_dir)
    assert done.replaced == 1 and done.run_id != cut
    assert [r.info.run_id for r in runs_of(run_dir)] == [done.run_id]
