"""kvscope.probe.tracing's TrackingRun against a real MLflow SQLite store (one store for the
module): params, artifacts, the export pipeline's sizes and the trace audit, with traces made by
plain MLflow spans (the traces kvscope writes are tested in test_traces.py)."""

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlflow
import pytest
from mlflow.entities import Trace
from mlflow.tracing.provider import _get_span_processor, _get_trace_exporter
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

from kvscope.config import TrackingConfig
from kvscope.probe.tracing import (
    PARAM_VALUE_LIMIT,
    QUEUE_SIZE_ENV,
    SIZE_STATS_KEY,
    SPAN_BATCH_ENV,
    SPAN_BATCH_SIZE,
    TRACE_QUEUE_SIZE,
    TRUNCATED,
    TraceAudit,
    TrackingRun,
    trace_complete,
)

BENCH = "bench-1"
SPANS = 6  # per trace: a root and five children


def make_traces(n: int) -> None:
    """n traces of SPANS spans each, linked to the active MLflow run."""
    for i in range(n):
        with mlflow.start_span(f"workflow-{i}") as root:
            mlflow.update_current_trace(metadata={"mlflow.trace.session": f"thread-{i}"})
            root.set_inputs({"i": i})
            for j in range(SPANS - 1):
                with mlflow.start_span(f"call-{j}"):
                    pass


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    env = pytest.MonkeyPatch()  # open() sets process-global MLflow state: undo it afterwards
    env.delenv(QUEUE_SIZE_ENV, raising=False)
    env.delenv(SPAN_BATCH_ENV, raising=False)
    env.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield tmp_path_factory.mktemp("runs")
    env.undo()


def open_run(runs_dir: Path) -> TrackingRun:
    return TrackingRun.open(TrackingConfig(experiment="kvscope-test"), runs_dir)


@dataclass
class Traced:
    run: TrackingRun
    audit: TraceAudit
    traces: dict[str, Trace]  # by session (thread_id)


@pytest.fixture(scope="module")
def traced(runs_dir: Path) -> Traced:
    run = open_run(runs_dir)
    params: dict[str, object] = {f"p{i}": i for i in range(120)}
    params["launch_command"] = "x" * 7000
    run.start("three-workflows", params, {"benchmark_run_id": BENCH})
    make_traces(3)
    artifact = runs_dir / "summary.json"
    artifact.write_text("{}")
    run.log_artifact(artifact)
    run.log_dict({"rows": 3}, "audit/extra.json")
    audit = run.finish(expected_traces=3)
    found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
    traces = {t.info.trace_metadata["mlflow.trace.session"]: t for t in found}
    return Traced(run, audit, traces)


def test_audit_counts_all_traces_written(traced: Traced) -> None:
    assert traced.audit == TraceAudit(expected=3, written=3, dropped=0, incomplete=0)
    metrics = traced.run.client.get_run(traced.run.run_id or "").data.metrics
    assert (metrics["traces_expected"], metrics["traces_written"]) == (3, 3)
    assert metrics["traces_dropped"] == 0


def test_run_params_artifacts_and_store_layout(traced: Traced, runs_dir: Path) -> None:
    run = traced.run
    assert run.tracking_uri == f"sqlite:///{runs_dir.resolve()}/mlflow.db"
    data = run.client.get_run(run.run_id or "")
    assert data.info.status == "FINISHED"
    assert data.data.tags["benchmark_run_id"] == BENCH
    params = data.data.params
    assert len(params) == 121 and params["p119"] == "119"
    assert len(params["launch_command"]) == PARAM_VALUE_LIMIT
    assert params["launch_command"].endswith(TRUNCATED)
    experiment = run.client.get_experiment(run.experiment_id)
    assert experiment.artifact_location == (runs_dir / "mlartifacts").as_uri()
    artifacts = runs_dir / "mlartifacts" / (run.run_id or "") / "artifacts"
    assert (artifacts / "summary.json").read_text() == "{}"
    assert json.loads((artifacts / "audit" / "extra.json").read_text()) == {"rows": 3}
    assert data.info.artifact_uri == f"{experiment.artifact_location}/{run.run_id}/artifacts"


def test_export_pipeline_sized_before_tracing(traced: Traced) -> None:
    processor = _get_span_processor()  # built by the first span after TrackingRun.open
    assert processor.span_exporter._async_queue._queue.maxsize == TRACE_QUEUE_SIZE
    assert processor._batch_delegate._batch_processor._max_export_batch_size == SPAN_BATCH_SIZE


def test_param_limit_matches_mlflow() -> None:
    assert PARAM_VALUE_LIMIT == MAX_PARAM_VAL_LENGTH


def test_audit_reports_missing_traces(traced: Traced, runs_dir: Path) -> None:
    run = open_run(runs_dir)
    run.start("one-short", {}, {})
    make_traces(1)
    assert run.finish(expected_traces=2, status="FAILED") == TraceAudit(2, 1, 1, 0)
    data = run.client.get_run(run.run_id or "")
    assert data.data.metrics["traces_dropped"] == 1
    assert data.info.status == "FAILED"


def test_real_queue_drops_are_counted(
    traced: Traced, runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(QUEUE_SIZE_ENV, "1")  # an exported value wins over kvscope's default
    run = open_run(runs_dir)
    run.start("tiny-queue", {}, {})
    make_traces(20)  # 20 traces' export tasks arrive at once
    assert _get_trace_exporter()._async_queue._queue.maxsize == 1
    audit = run.finish(expected_traces=20)
    assert audit.dropped > 0
    assert audit.written + audit.dropped == 20
    found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
    assert sum(len(t.data.spans) == SPANS for t in found) == audit.written
    mlflow.tracing.reset()  # the next tracer provider gets a normal queue again


def test_trace_missing_spans_is_incomplete() -> None:
    def fake(spans: int, num_spans: int | None) -> Any:
        stats = {} if num_spans is None else {SIZE_STATS_KEY: json.dumps({"num_spans": num_spans})}
        return SimpleNamespace(
            info=SimpleNamespace(trace_metadata=stats), data=SimpleNamespace(spans=[None] * spans)
        )

    assert trace_complete(fake(9, 9))
    assert not trace_complete(fake(2, 9))
    assert trace_complete(fake(3, None))
    assert not trace_complete(fake(0, None))


def test_audit_reads_the_store_a_page_at_a_time() -> None:
    """The audit counts a page of traces and lets it go before it reads the next: a 10,400-trace
    load run held at once with its spans took ~1 GiB at publish (bench/load.py)."""

    class Page(list):  # type: ignore[type-arg]
        token: str | None = None

    asked: list[str | None] = []

    class Client:
        def search_traces(self, *, page_token: str | None, include_spans: bool, **_: Any) -> Page:
            asked.append(page_token)
            start = int(page_token or 0)
            spans = [None] if include_spans else []
            trace = SimpleNamespace(info=SimpleNamespace(trace_metadata={}),
                                    data=SimpleNamespace(spans=spans))  # fmt: skip
            page = Page([trace] * min(500, 1200 - start))
            page.token = str(start + 500) if start + 500 < 1200 else None
            return page

    run = TrackingRun(Client(), "sqlite:///x", "0")  # type: ignore[arg-type]
    run.run_id = "r"
    traces = run._search("r", include_spans=True)
    next(traces)
    assert asked == [None]  # one page read so far, not the whole run
    assert sum(1 for _ in traces) == 1199
    assert asked == [None, "500", "1000"]
    assert run.audit(1200) == TraceAudit(1200, 1200, 0, 0)


def test_the_counting_audit_judges_as_the_loading_one(
    traced: Traced, runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the SQLite store the audit counts span rows in one query; it finds what loading
    every trace with its spans finds: the run's own traces and the ones linked to it, a trace
    short of spans incomplete, another run's and another experiment's left out."""
    run = open_run(runs_dir)
    run.start("counted", {}, {})
    make_traces(4)
    mlflow.flush_trace_async_logging()
    mlflow.end_run()
    other = open_run(runs_dir)
    other.start("elsewhere", {}, {})
    make_traces(2)  # another run's: not counted
    mlflow.flush_trace_async_logging()
    mlflow.end_run()
    mlflow.set_experiment(experiment_id=run.experiment_id)
    with mlflow.start_span("app-root") as root:  # no run active: the app's own trace
        pass
    mlflow.flush_trace_async_logging()
    run.client.link_traces_to_run([root.trace_id], run.run_id or "")
    found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
    short = next(t.info.trace_id for t in found if len(t.data.spans) == SPANS)
    with sqlite3.connect(runs_dir / "mlflow.db") as db:  # a span batch lost on its way
        db.execute("DELETE FROM spans WHERE trace_id = ? AND name = 'call-0'", (short,))
    counted = run.audit(6)
    monkeypatch.setattr("kvscope.probe.tracing._store", lambda _: None)  # a server's way
    assert run.audit(6) == counted == TraceAudit(6, 4, 2, 1)


def test_ui_command(tmp_path: Path) -> None:
    argv, env = TrackingRun.ui_command(tmp_path, 5123)
    assert argv[1:4] == ["-m", "mlflow", "server"]
    opts = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert opts == {
        "--backend-store-uri": f"sqlite:///{tmp_path.resolve()}/mlflow.db",
        "--default-artifact-root": (tmp_path.resolve() / "mlartifacts").as_uri(),
        "--host": "127.0.0.1",
        "--port": "5123",
        "--workers": "1",
    }
    assert env == {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
