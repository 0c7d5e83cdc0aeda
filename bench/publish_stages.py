"""bench/finalize_run.py --publish's child: a written run directory finalized and published as
`kvscope run` concludes a run (pipeline.py, publish.py), each stage timed. Prints numbers.

Stages, in order: MLflow open + start (params; at a run's start, before its calls: left out of
the total), finalize (the tables), analysis (analyze_run), summary + figures (summary.json,
timeline.png, evictions.png), report (report.html), then the MLflow run in a fresh local SQLite
store beside the run directory (kvscope's default, `sqlite:///<runs>/mlflow.db`): metrics,
artifacts, traces (planned from the rows and streams, built and inserted by
kvscope.traces.write_traces in a child process, kvscope/trace_job.py, started by publish before
the summary, beside the figures and the report; with --traces-before-analysis once the tables
are written, beside the analysis too; the last slices written by publish after its report;
printed: the child's seconds from start to exit, its peak RSS, and how long publish wrote
slices and waited for it after the report), the audit (TrackingRun.finish: every trace of the
run counted with its spans, the audit's metrics logged, the run ended). Then the audit against
the rows (a trace per invocation expected), this process's peak RSS (VmHWM), the CPU seconds of
this process and of the trace writer, and the load average.
"""

import os
import resource
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope import trace_writer, traces
from kvscope.analysis.run import analyze_run
from kvscope.config import TrackingConfig
from kvscope.finalize import finalize
from kvscope.probe.tracing import TrackingRun
from kvscope.publish import WorkloadOutcome, publish
from kvscope.records import requests
from kvscope.trace_job import TraceJob


def _timed(module: Any, name: str, spent: dict[str, float], key: str) -> None:
    """`module.name` replaced by itself adding its seconds to spent[key]."""
    inner: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t

    setattr(module, name, wrapper)


def watch(process: subprocess.Popen[bytes], inside: dict[str, float]) -> None:
    """The trace writer's seconds from its start to its exit and its peak RSS (VmHWM, read
    every 0.2 s: its rusage would count the parent's pages it was forked with)."""
    t0, peak = time.perf_counter(), 0
    while process.poll() is None:
        try:
            status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
            peak = max(peak, next(int(x.split()[1]) for x in status if x.startswith("VmHWM")))
        except (OSError, StopIteration):
            pass
        time.sleep(0.2)
    inside["trace writer start to exit"] = time.perf_counter() - t0
    inside["trace writer peak RSS MiB"] = peak / 1024


def publish_run(folder: str, early: bool = False) -> None:
    run_dir = Path(folder)
    calls = sum(1 for _ in (run_dir / requests.REQUESTS_JSONL).open())
    stages: dict[str, tuple[float, float]] = {}  # name -> (wall, this process's CPU) seconds
    t, cpu0 = time.perf_counter(), time.process_time()

    def stage(name: str) -> None:
        nonlocal t, cpu0
        now, cpu = time.perf_counter(), time.process_time()
        stages[name] = (now - t, cpu - cpu0)
        t, cpu0 = now, cpu

    names = iter(["summary.json + figures", "report.html"])
    tracking = TrackingRun.open(TrackingConfig(experiment="bench-publish"), run_dir.parent)
    tracking.start(run_dir.name, {"calls": calls}, {"benchmark_run_id": run_dir.name})
    stage("MLflow open + start (at a run's start)")
    inside: dict[str, float] = {}
    start, watching = TraceJob.start, []

    def started(*args: Any, **kwargs: Any) -> TraceJob | None:
        job = start(*args, **kwargs)
        if job is not None:
            watching.append(threading.Thread(target=watch, args=(job.process, inside)))
            watching[-1].start()
        return job

    TraceJob.start = started  # type: ignore[method-assign, assignment]
    share = TraceJob.share

    def shared(self: TraceJob, *args: Any) -> Any:
        t0 = time.perf_counter()
        done = share(self, *args)
        inside["publish writing the last slices and waiting, after the report"] = (
            time.perf_counter() - t0)  # fmt: skip
        for thread in watching:
            thread.join()
        return done

    TraceJob.share = shared  # type: ignore[method-assign]
    job = None
    if early:  # as the pipeline does: the trace writer started (its imports) beside finalize,
        # told to go on the finalized tables, beside the analysis
        job = TraceJob.start(run_dir, tracking.tracking_uri, tracking.experiment_id,
                             tracking.run_id or "", go=False)  # fmt: skip
    done = finalize(run_dir)
    if job is not None:
        job.go()
    stage("finalize (tables)")
    analysis = analyze_run(run_dir)
    stage("analysis")
    _timed(traces, "plan_traces", inside, "plan (here, no child)")
    _timed(trace_writer, "build_trace", inside, "build (here)")
    _timed(trace_writer, "insert_sqlite", inside, "insert (here)")
    _timed(TrackingRun, "finish", inside, "audit + run ended")
    outcome = publish(analysis, tracking, WorkloadOutcome(), trace_job=job,
                      on_stage=lambda _: stage(next(names)))  # fmt: skip
    stage("MLflow: metrics, artifacts, traces, audit")
    invocations = len(set(analysis.requests.column("workflow_run_id").to_pylist()))
    status = Path("/proc/self/status").read_text().splitlines()
    hwm = next(int(x.split()[1]) for x in status if x.startswith("VmHWM"))
    print(f"{calls:,} calls in requests.jsonl, {done.rows:,} rows in requests.parquet, "
          f"{invocations:,} invocations")  # fmt: skip
    for name, (seconds, cpu_s) in stages.items():
        print(f"  {name:42s} {seconds:7.2f} s  (CPU {cpu_s:6.2f} s)")
    print("  traces: " + ", ".join(f"{k} {v:,.2f}" + ("" if "MiB" in k else " s")
                                   for k, v in inside.items()))  # fmt: skip
    total = sum(v for k, (v, _) in stages.items() if not k.startswith("MLflow open"))
    print(f"finalize + publish (all but MLflow open + start): {total:.2f} s; peak RSS "
          f"{hwm / 1024:,.0f} MiB (this process)")  # fmt: skip
    cpu = {who: (u.ru_utime + u.ru_stime) for who, u in (
        ("this process", resource.getrusage(resource.RUSAGE_SELF)),
        ("the trace writers", resource.getrusage(resource.RUSAGE_CHILDREN)))}  # fmt: skip
    print("CPU (user + sys): " + ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items())
          + f"; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    audit = outcome.audit
    print(f"audit: {audit.written if audit else 0:,} traces complete of "
          f"{audit.expected if audit else 0:,} expected ({audit.dropped if audit else '-'} "
          f"dropped, {audit.incomplete if audit else '-'} incomplete); MLflow error: "
          f"{outcome.mlflow_error}")  # fmt: skip
