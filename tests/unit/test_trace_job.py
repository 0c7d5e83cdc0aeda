"""kvscope.trace_job: publish's traces written by a child process beside the report, into a real
MLflow SQLite store; a child that fails before writing leaves the traces to publish's process,
one that fails while writing is not rerun and its traces are counted as planned."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT
from test_traces import open_run, store  # noqa: F401  (store: a fixture)

import kvscope.trace_job
import kvscope.traces
from kvscope.analysis.run import RunAnalysis, analyze_run
from kvscope.finalize import finalize
from kvscope.probe.child import CAPTURE_ENV
from kvscope.publish import WorkloadOutcome, publish
from kvscope.trace_job import PLANNED, RESULT, TraceJob
from kvscope.traces import TraceWrite

RUN = "fixture-pressure-20261123-190437-ee5775"  # 2 invocations


def recorded(runs: Path, name: str) -> RunAnalysis:
    run_dir = runs / name
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, run_dir)
    finalize(run_dir)
    return analyze_run(run_dir)


def test_the_child_writes_every_trace(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def not_here(*_: object, **__: object) -> TraceWrite:
        raise AssertionError("written in publish's process")

    monkeypatch.setattr(kvscope.traces, "write_traces", not_here)  # publish imports it late
    analysis = recorded(store, "child")
    run = open_run(store, "child")
    outcome = publish(analysis, run, WorkloadOutcome())
    assert outcome.mlflow_error is None and outcome.audit is not None
    assert outcome.audit.expected == outcome.audit.written == 2 and not outcome.audit.dropped
    assert not (analysis.run_dir / RESULT).exists() and not (analysis.run_dir / PLANNED).exists()


def test_a_child_that_fails_before_writing_leaves_them_to_publish(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(kvscope.trace_job.sys, "executable", shutil.which("false"))
    analysis = recorded(store, "fallback")
    run = open_run(store, "fallback")
    outcome = publish(analysis, run, WorkloadOutcome())
    assert outcome.audit is not None
    assert outcome.audit.expected == outcome.audit.written == 2 and not outcome.audit.dropped
    assert "failed before writing" in caplog.text


def test_a_child_that_fails_while_writing_is_not_rerun(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    code = f"import sys; open({str(tmp_path / PLANNED)!r}, 'w').write('7'); sys.exit('locked')"
    process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    assert TraceJob(process, tmp_path).wait() == TraceWrite(written=7, app_linked=0)
    assert "failed while writing (exit 1: locked)" in caplog.text
    assert not (tmp_path / PLANNED).exists()


def test_the_child_is_never_a_profiled_programs_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, dict[str, str]] = {}

    class Started:
        def __init__(self, argv: list[str], **kwargs: dict[str, str]) -> None:
            seen["env"] = kwargs["env"]

    monkeypatch.setenv(CAPTURE_ENV, str(tmp_path / "capture.json"))
    monkeypatch.setattr(kvscope.trace_job.subprocess, "Popen", Started)
    assert TraceJob.start(tmp_path, "sqlite:///x.db", "1", "r", go=False) is not None
    assert CAPTURE_ENV not in seen["env"] and seen["env"]["PATH"] == os.environ["PATH"]


def test_a_job_started_before_the_analysis_is_the_one_publish_waits_for(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_dir = store / "early"
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, run_dir)
    finalize(run_dir)
    run = open_run(store, "early")
    job = TraceJob.start(run_dir, run.tracking_uri, run.experiment_id, run.run_id or "")
    assert job is not None
    monkeypatch.setattr(TraceJob, "start", None)  # no second one
    outcome = publish(analyze_run(run_dir), run, WorkloadOutcome(), trace_job=job)
    assert outcome.audit is not None and outcome.audit.written == outcome.audit.expected == 2
    assert job.process.returncode == 0


def test_a_job_started_before_finalize_writes_once_told(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipeline's order: the child started (its imports) before the table is written, told
    to go once it is; a child never told writes nothing and publish writes the traces itself."""
    run_dir = store / "told"
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, run_dir)
    run = open_run(store, "told")
    job = TraceJob.start(run_dir, run.tracking_uri, run.experiment_id, run.run_id or "", go=False)
    assert job is not None
    finalize(run_dir)
    job.go()
    monkeypatch.setattr(TraceJob, "start", None)  # no second one
    outcome = publish(analyze_run(run_dir), run, WorkloadOutcome(), trace_job=job)
    assert outcome.audit is not None and outcome.audit.written == outcome.audit.expected == 2

    monkeypatch.undo()
    untold = TraceJob.start(run_dir, run.tracking_uri, run.experiment_id, "r2", go=False)
    assert untold is not None
    assert untold.wait() is None  # exited at its stdin's end, nothing written: the caller writes
    assert untold.process.returncode == 0
