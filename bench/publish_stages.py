"""bench/finalize_run.py --publish's child: a written run directory finalized and published as
`kvscope run` concludes a run (pipeline.py, publish.py), each stage timed. Prints numbers.

Stages, in order: finalize (the tables), analysis (analyze_run), summary + figures
(summary.json, timeline.png, evictions.png), report (report.html), then the MLflow run in a
fresh local SQLite store beside the run directory (kvscope's default, `sqlite:///<runs>/mlflow.db`):
open + start (params), metrics + artifacts, traces (planned from the rows and streams, built and
inserted: kvscope.traces.write_traces; its plan / build / insert seconds are summed by wrapping
the functions, and build and insert overlap), the audit (TrackingRun.finish: every trace of the
run counted with its spans, the audit's metrics logged, the run ended). Then the audit against
the rows (a trace per invocation expected) and the child's peak RSS (VmHWM).
"""

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


def publish_run(folder: str) -> None:
    run_dir = Path(folder)
    calls = sum(1 for _ in (run_dir / requests.REQUESTS_JSONL).open())
    stages: dict[str, float] = {}
    t = time.perf_counter()

    def stage(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        stages[name] = now - t
        t = now

    names = iter(["summary.json + figures", "report.html"])
    done = finalize(run_dir)
    stage("finalize (tables)")
    analysis = analyze_run(run_dir)
    stage("analysis")
    tracking = TrackingRun.open(TrackingConfig(experiment="bench-publish"), run_dir.parent)
    tracking.start(run_dir.name, {"calls": calls}, {"benchmark_run_id": run_dir.name})
    stage("MLflow open + start")
    inside: dict[str, float] = {}
    _timed(traces, "plan_traces", inside, "plan")
    _timed(trace_writer, "build_trace", inside, "build")
    _timed(trace_writer, "insert_sqlite", inside, "insert")
    _timed(TrackingRun, "finish", inside, "audit + run ended")
    outcome = publish(analysis, tracking, WorkloadOutcome(), on_stage=lambda _: stage(next(names)))
    stage("MLflow: metrics, artifacts, traces, audit")
    invocations = len(set(analysis.requests.column("workflow_run_id").to_pylist()))
    status = Path("/proc/self/status").read_text().splitlines()
    hwm = next(int(x.split()[1]) for x in status if x.startswith("VmHWM"))
    print(f"{calls:,} calls in requests.jsonl, {done.rows:,} rows in requests.parquet, "
          f"{invocations:,} invocations")  # fmt: skip
    for name, seconds in stages.items():
        print(f"  {name:42s} {seconds:7.2f} s")
    print("  in MLflow's: " + ", ".join(f"{k} {v:.2f} s" for k, v in inside.items())
          + " (build and insert overlap where insert runs in its thread)")  # fmt: skip
    total = sum(stages.values())
    print(f"finalize + publish: {total:.2f} s; the child's peak RSS {hwm / 1024:,.0f} MiB")
    audit = outcome.audit
    print(f"audit: {audit.written if audit else 0:,} traces complete of "
          f"{audit.expected if audit else 0:,} expected ({audit.dropped if audit else '-'} "
          f"dropped, {audit.incomplete if audit else '-'} incomplete); MLflow error: "
          f"{outcome.mlflow_error}")  # fmt: skip
