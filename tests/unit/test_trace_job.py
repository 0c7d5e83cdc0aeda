"""kvscope.trace_job: publish's traces written by a child process beside the report and by
publish once its report is written (slices claimed from both ends), into a real MLflow SQLite
store, every trace once; a child that fails is not rerun: what it planned counts, what it
claimed and never planned and what it never claimed publish writes."""

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import ROOT
from test_traces import graph_row, open_run, store  # noqa: F401  (store: a fixture)

import kvscope.trace_job
from kvscope.analysis.run import RunAnalysis, analyze_run
from kvscope.finalize import finalize
from kvscope.probe.child import CAPTURE_ENV
from kvscope.publish import WorkloadOutcome, publish
from kvscope.records.requests import to_table
from kvscope.trace_job import CLAIM, RESULT, SLICES, TraceJob, slice_rows
from kvscope.traces import TraceWrite

RUN = "fixture-pressure-20261123-190437-ee5775"  # 2 invocations


def recorded(runs: Path, name: str) -> RunAnalysis:
    run_dir = runs / name
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, run_dir)
    finalize(run_dir)
    return analyze_run(run_dir)


def left_over(run_dir: Path) -> list[str]:
    return [p.name for p in run_dir.iterdir() if p.name.startswith((RESULT, CLAIM))]


def test_the_child_and_publish_write_every_trace_once(store: Path) -> None:  # noqa: F811
    analysis = recorded(store, "child")
    run = open_run(store, "child")
    outcome = publish(analysis, run, WorkloadOutcome())
    assert outcome.mlflow_error is None and outcome.audit is not None
    assert outcome.audit.expected == outcome.audit.written == 2 and not outcome.audit.dropped
    assert not left_over(analysis.run_dir)


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
    assert "the child process failed (exit 1" in caplog.text


def table(traces: int) -> pa.Table:
    """`traces` invocations of 2 calls each, the later ones started later."""
    return to_table([graph_row(f"r{w}-{i}", w * 10 + i, f"wf-{w:03d}", "planner", 1)
                     for w in range(traces) for i in range(2)])  # fmt: skip


def recording(slices: list[int]) -> Callable[..., TraceWrite]:
    """A writer that notes each slice it is given (by its first row) and plans its traces."""
    index = slice_rows(table(64))

    def write(rows: pa.Table, planned: Callable[[int], None]) -> TraceWrite:
        first = int(rows.column("request_uuid")[0].as_py().split("-")[0][1:])
        slices.append(index[first * 2].as_py())
        count = len(set(rows.column("workflow_run_id").to_pylist()))
        planned(count)
        return TraceWrite(count, 0)

    return write


def exited(code: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                               stderr=subprocess.PIPE)  # fmt: skip
    process.wait()
    return process


def test_publish_writes_from_the_last_slice_until_it_meets_the_childs(tmp_path: Path) -> None:
    for k in range(6):  # the child's, written: 4 traces each (64 in 16 slices)
        (tmp_path / f"{CLAIM}{k}").write_text("4")
    (tmp_path / RESULT).write_text(json.dumps({"written": 24, "app_linked": 0}))
    written: list[int] = []
    done = TraceJob(exited("pass"), tmp_path).share(table(64), recording(written))
    assert written == list(range(SLICES - 1, 5, -1))  # the last first, each once
    assert done == TraceWrite(64, 0)
    assert not left_over(tmp_path)


def test_a_child_that_fails_while_writing_is_not_rerun(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It planned slice 0 (7 traces, counted: the audit finds what is missing) and claimed
    slice 1 without planning it (nothing of it written: publish writes it)."""
    (tmp_path / f"{CLAIM}0").write_text("7")
    (tmp_path / f"{CLAIM}1").write_text("")
    written: list[int] = []
    done = TraceJob(exited("import sys; sys.exit('locked')"), tmp_path).share(
        table(64), recording(written))  # fmt: skip
    assert sorted(written) == list(range(1, SLICES))
    assert done == TraceWrite(7 + 60, 0)
    assert "the child process failed (exit 1: locked)" in caplog.text
    assert not left_over(tmp_path)


def test_slices_hold_each_trace_whole_in_time_order() -> None:
    rows = [graph_row(f"r{i}", (i * 7919) % 400, f"wf-{i % 40}", "planner", 1) for i in range(200)]
    rows += [graph_row(f"lone{i}", 500 + i, None, None, 1) for i in range(8)]  # type: ignore[arg-type]
    requests = to_table(rows)
    index = slice_rows(requests).to_pylist()
    runs = requests.column("workflow_run_id").to_pylist()
    starts = requests.column("start_ns").to_pylist()
    by_trace: dict[str, set[int]] = {}
    first: dict[str, int] = {}
    for k, run, uuid, start in zip(index, runs, requests.column("request_uuid").to_pylist(),
                                   starts, strict=True):  # fmt: skip
        key = run or uuid
        by_trace.setdefault(key, set()).add(k)
        first[key] = min(first.get(key, start), start)
    assert all(len(s) == 1 for s in by_trace.values())  # a trace's rows in one slice
    ordered = sorted(first, key=lambda key: first[key])
    slices = [next(iter(by_trace[key])) for key in ordered]
    assert slices == sorted(slices)  # in time order
    counts = [slices.count(k) for k in range(SLICES)]
    assert max(counts) - min(counts) <= 1  # 48 traces: 3 each


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
    caplog: pytest.LogCaptureFixture,
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
    again = open_run(store, "untold")
    untold = TraceJob.start(run_dir, again.tracking_uri, again.experiment_id,
                            again.run_id or "", go=False)  # fmt: skip
    assert untold is not None
    with caplog.at_level(logging.WARNING):
        outcome = publish(analyze_run(run_dir), again, WorkloadOutcome(), trace_job=untold)
    assert outcome.audit is not None and outcome.audit.written == outcome.audit.expected == 2
    assert untold.process.returncode == 0 and "failed" not in caplog.text
