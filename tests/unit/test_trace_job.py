"""kvscope.trace_job: publish's traces written by child processes beside the report, into a real
MLflow SQLite store, a large run's split between children (every trace written once); a child
that fails before writing leaves its part to publish's process, one that fails while writing is
not rerun and its traces are counted as planned."""

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
from kvscope.records.requests import to_table
from kvscope.trace_job import PLANNED, RESULT, WHOLE, TraceJob, in_part, parts_for
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
    assert not [p for p in analysis.run_dir.iterdir() if p.name.startswith((RESULT, PLANNED))]


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
    planned = tmp_path / f"{PLANNED}.0"
    code = f"import sys; open({str(planned)!r}, 'w').write('7'); sys.exit('locked')"
    process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    assert TraceJob((process,), tmp_path).wait() == (TraceWrite(written=7, app_linked=0), [])
    assert "failed while writing (exit 1: locked)" in caplog.text
    assert not planned.exists()


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
    assert job.processes[0].returncode == 0


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
    # exited at its stdin's end, nothing written: the caller writes it all
    assert untold.wait() == (TraceWrite(0, 0), [WHOLE])
    assert untold.processes[0].returncode == 0


def test_a_split_job_writes_every_trace_once(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two children, each its part of the invocations; both traces in the store, none twice."""
    run_dir = store / "split"
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, run_dir)
    finalize(run_dir)
    run = open_run(store, "split")
    job = TraceJob.start(run_dir, run.tracking_uri, run.experiment_id, run.run_id or "", parts=2)
    assert job is not None and len(job.processes) == 2
    monkeypatch.setattr(kvscope.traces, "write_traces", None)  # nothing written here
    outcome = publish(analyze_run(run_dir), run, WorkloadOutcome(), trace_job=job)
    assert outcome.audit is not None and outcome.audit.written == outcome.audit.expected == 2
    assert not outcome.audit.dropped and not outcome.audit.incomplete


def test_a_part_whose_child_failed_before_writing_is_written_by_publish(
    store: Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_dir = store / "half"
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, run_dir)
    run = open_run(store, "half")
    job = TraceJob.start(run_dir, run.tracking_uri, run.experiment_id, run.run_id or "",
                         go=False, parts=2)  # fmt: skip
    assert job is not None
    job.processes[1].kill()  # part 1's child is gone before it wrote anything
    finalize(run_dir)
    job.go()
    outcome = publish(analyze_run(run_dir), run, WorkloadOutcome(), trace_job=job)
    assert outcome.audit is not None and outcome.audit.written == outcome.audit.expected == 2
    assert not outcome.audit.dropped and not outcome.audit.incomplete
    assert "failed before writing" in caplog.text and "writing its part here" in caplog.text


def test_parts_hold_each_trace_whole_and_every_row_once() -> None:
    rows = [{"request_uuid": f"r{i}", "workflow_run_id": None if i % 5 == 0 else f"w{i // 4}",
             "start_ns": i} for i in range(400)]  # fmt: skip
    table = to_table(rows)
    parts = [in_part(table, (k, 3)) for k in range(3)]
    uuids = [set(p.column("request_uuid").to_pylist()) for p in parts]
    assert sorted(u for part in uuids for u in part) == sorted(f"r{i}" for i in range(400))
    for k, part in enumerate(parts):
        runs = {r for r in part.column("workflow_run_id").to_pylist() if r is not None}
        for other in parts[:k] + parts[k + 1 :]:
            assert not runs & set(other.column("workflow_run_id").to_pylist())
        assert 60 < part.num_rows < 200  # about a third each
    assert in_part(table, WHOLE) is table


def test_a_small_run_gets_one_child(tmp_path: Path) -> None:
    (tmp_path / "requests.jsonl").write_text("{}\n" * 10)
    assert parts_for(tmp_path) == 1
    assert parts_for(tmp_path / "absent") == 1
