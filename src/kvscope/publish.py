"""Publish one analysed run: summary.json, the figures, report.html and the MLflow run.

Everything here renders the one RunAnalysis; nothing is computed a second time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kvscope.probe.mlflow_store import TraceAudit, unreachable
from kvscope.records import run_dir as files
from kvscope.trace_job import TraceJob

if TYPE_CHECKING:  # MLflow and matplotlib load where they are used: a profiled app's process
    import pyarrow as pa

    from kvscope.analysis.agents import AgentSummary  # and the analysis (duckdb) when it runs
    from kvscope.analysis.run import RunAnalysis
    from kvscope.probe.tracing import TrackingRun  # imports this module before its calls
    from kvscope.traces import TraceWrite

LOGGED_TAG = "kvscope.logged"  # set last: an MLflow run without it was cut off mid-upload


class _Workflow(Protocol):
    ok: bool
    unparsed_verdicts: int


@dataclass(frozen=True)
class WorkloadOutcome:
    """What the workload driver knows beyond the request rows; None: not known (a user's app)."""

    workflows: int | None = None  # workflows run
    failed: int | None = None  # workflows ended by a failed call
    unparsed_verdicts: int | None = None  # Reviewer verdicts treated as REVISE
    planned: int | None = None  # workflows the configuration asked for

    @classmethod
    def of(cls, results: Sequence[_Workflow], planned: int | None = None) -> WorkloadOutcome:
        return cls(
            len(results),
            sum(not r.ok for r in results),
            sum(r.unparsed_verdicts for r in results),
            planned,
        )


@dataclass(frozen=True)
class RunOutcome:
    analysis: RunAnalysis
    workload: WorkloadOutcome
    mlflow_run_id: str | None
    tracking_uri: str | None
    audit: TraceAudit | None
    error: str | None = None  # why the run stopped early; what was measured is kept
    mlflow_error: str | None = None  # why the run is not in MLflow (kvscope log RUN uploads it)

    @property
    def benchmark_run_id(self) -> str:
        return self.analysis.benchmark_run_id

    @property
    def run_dir(self) -> Path:
        return self.analysis.run_dir


def write_files(analysis: RunAnalysis, on_stage: Callable[[str], None] = lambda _: None) -> None:
    """summary.json, timeline.png, evictions.png and report.html in the run directory."""
    from kvscope.report import plots, timeline
    from kvscope.report.pages import write_run_report

    run_dir = analysis.run_dir
    (run_dir / files.SUMMARY_JSON).write_text(json.dumps(analysis.summary(), indent=2))
    rows = timeline.call_rows(analysis.requests)
    if rows:
        timeline.plot(
            rows,
            analysis.series,
            run_dir / files.TIMELINE_PNG,
            f"{analysis.benchmark_run_id}: KV cache and calls",
        )
    for r in analysis.replicas:  # a deployment: each replica's cache and the calls it served
        timeline.plot(
            [x for x in rows if x.get("replica") == r.name],
            r.series,
            files.replica_dir(run_dir, r.name) / files.TIMELINE_PNG,
            f"{analysis.benchmark_run_id} {r.name}: KV cache and the calls it served",
        )
    if analysis.evictions is not None and analysis.evictions.num_rows:
        plots.write_png(
            plots.eviction_heatmap(analysis.evictions, analysis.order),
            run_dir / files.EVICTIONS_PNG,
        )
    on_stage("writing report.html")
    try:
        write_run_report(analysis)
    except Exception as err:  # the tables are written: a report failure must not lose them
        (run_dir / files.REPORT_ERROR).write_text(f"{type(err).__name__}: {err}\n")


def publish(
    analysis: RunAnalysis,
    tracking: TrackingRun | None,
    workload: WorkloadOutcome,
    *,
    failure: BaseException | None = None,
    traces: bool = True,
    on_stage: Callable[[str], None] = lambda _: None,
    offline: str | None = None,
    trace_job: TraceJob | None = None,
) -> RunOutcome:
    """Write the run's files, then log its metrics and files to its MLflow run and end that.
    The run's traces are written meanwhile by a child process (kvscope/trace_job.py): started
    here, or `trace_job`, one the caller started on the finalized run directory before its
    analysis (the traces then run beside the analysis too); not used, it is stopped.

    Local-first: with no MLflow run (`offline` says why), or an MLflow that fails now, the
    files are all written and run.json's `mlflow` says the run is not logged; `kvscope log RUN`
    uploads it later. An MLflow failure never loses what was measured, and is not raised.
    """
    error = run_error(analysis, failure)
    uri = tracking.tracking_uri if tracking else None
    problem = (offline or "no MLflow run") if uri is None else unreachable(uri)
    job = None
    if traces and tracking is not None and problem is None and tracking.run_id:
        job = trace_job or TraceJob.start(analysis.run_dir, tracking.tracking_uri,
                                          tracking.experiment_id, tracking.run_id)  # fmt: skip
    elif trace_job is not None:
        trace_job.cancel()
    try:
        write_files(analysis, on_stage)
    except BaseException:
        if job is not None:
            job.cancel()
        raise
    audit = None
    if tracking is not None and problem is None:
        on_stage("logging to MLflow")
        try:
            audit = log_run(analysis, tracking, workload, traces=traces, error=error, job=job)
        except Exception as err:  # MLflow's or its HTTP client's: never lose the run for them
            problem = f"MLflow logging failed: {type(err).__name__}: {err}"
    mlflow_record(analysis.run_dir, tracking, problem)
    logged = tracking.run_id if tracking is not None and problem is None else None
    return RunOutcome(analysis, workload, logged, uri, audit, error, mlflow_error=problem)


def run_error(analysis: RunAnalysis, failure: BaseException | None) -> str | None:
    """Why the run's numbers do not cover its workload (its status), or the failure; None."""
    status = analysis.run.get("status") or {}
    error = None if failure is None else f"{type(failure).__name__}: {failure}".rstrip(": ")
    if status.get("state", "complete") != "complete":
        error = status.get("reason") or error
    return error


def log_run(
    analysis: RunAnalysis,
    tracking: TrackingRun,
    workload: WorkloadOutcome,
    *,
    traces: bool,
    error: str | None,
    job: TraceJob | None = None,
) -> TraceAudit:
    """The run's traces (`job`'s, where one was started), metrics, files and status into its
    (started) MLflow run, then end it. The traces come first: the child writing them is done
    before this process writes to the store (SQLite takes one writer at a time)."""
    # A trace per invocation (and per graph-less call) that has a row: kvscope's or the app's.
    expected = write_run_traces(analysis, tracking, job).expected if traces else 0
    tracking.log_metrics(run_metrics(analysis, workload))
    for name in files.ARTIFACTS:
        if (analysis.run_dir / name).exists():
            tracking.log_artifact(analysis.run_dir / name)
    for replica, folder in files.replica_dirs(analysis.run_dir).items():  # a deployment's
        for name in files.REPLICA_ARTIFACTS:
            if (folder / name).exists():
                tracking.log_artifact(folder / name, f"{files.REPLICAS_DIR}/{replica}")
    status = analysis.run.get("status") or {}
    tracking.set_tags({"kvscope.status": status.get("state", "unknown"),
                       "kvscope.status_reason": status.get("reason") or "",
                       LOGGED_TAG: "true"})  # fmt: skip
    return tracking.finish(expected, status="FINISHED" if error is None else "FAILED")


def mlflow_record(run_dir: Path, tracking: TrackingRun | None, problem: str | None) -> None:
    """run.json's `mlflow`: logged or not (and why), where."""
    run = files.read_run_json(run_dir)
    run["mlflow"] = {
        "logged": problem is None,
        "reason": problem,
        "run_id": tracking.run_id if tracking and problem is None else None,
        "tracking_uri": tracking.tracking_uri if tracking else None,
    }
    (run_dir / files.RUN_JSON).write_text(json.dumps(run, indent=2, default=str))


def write_run_traces(
    analysis: RunAnalysis, tracking: TrackingRun, job: TraceJob | None = None
) -> TraceWrite:
    """The run's MLflow traces from its finalized table and streams (kvscope/traces.py): `job`
    shares them with this process (trace_job.py), else all are written here."""
    from kvscope.traces import Streams, write_traces

    streams: list[Streams] = []  # read once, where this process writes any

    def write(rows: pa.Table, planned: Callable[[int], None]) -> TraceWrite:
        streams[:] = streams or [Streams.load(analysis.run_dir)]
        return write_traces(analysis.run_dir, rows, client=tracking.client,
                            experiment_id=tracking.experiment_id, run_id=tracking.run_id or "",
                            on_planned=planned, streams=streams[0])  # fmt: skip

    if job is None:
        return write(analysis.requests, lambda _: None)
    return job.share(analysis.requests, write)


def run_metrics(analysis: RunAnalysis, workload: WorkloadOutcome) -> dict[str, float | None]:
    """The MLflow run's metrics: per-agent summaries, /metrics, reconciliation, KV, time split."""
    a = analysis
    out: dict[str, float | None] = dict(agent_metrics([*a.agents, a.total]))
    out |= {f"server.{k}": v for k, v in a.server.items()}
    out |= {
        f"server.{agent}.{k}": v for agent, view in a.server_agents.items() for k, v in view.items()
    }
    out |= {f"server.replica.{r.name}.{k}": v for r in a.replicas for k, v in r.summary.items()}
    out |= {
        f"reconcile.{r.replica + '.' if r.replica else ''}{r.counter}.difference": r.difference
        for r in a.reconciliation
        if r.difference is not None
    }
    out |= {f"kv.{k}": v for k, v in a.eviction_summary().items()}
    for t in a.time_split:
        d = t.to_dict()
        out |= {
            f"time.{t.span}.{k}": d[k]
            for k in ("client_ms", "engine_ms", "core_ms", "client_side_ms", "front_end_ms")
            if d[k] is not None
        }
    if a.kv is not None:
        out["kv.missing_batches"] = float(a.kv.missing_batches)
    out |= predictability_metrics(a)
    counts = {
        "workflows_run": workload.workflows,
        "workflows_failed": workload.failed,
        "unparsed_verdicts": workload.unparsed_verdicts,
    }
    return out | {k: float(v) for k, v in counts.items() if v is not None}


def predictability_metrics(analysis: RunAnalysis) -> dict[str, float]:
    """predict.distinct_sequences, predict.workflows, and the predictor's overall accuracy 1, 2
    and 3 ahead (predict.accuracy_k; left out when nothing was predicted, never 0)."""
    p = analysis.predictability
    if not p.workflows:
        return {}
    out = {"predict.workflows": float(p.workflows),
           "predict.distinct_sequences": float(p.distinct_sequences)}  # fmt: skip
    everyone = p.accuracy[-1]
    for k in (1, 2, 3):
        value = getattr(everyone, f"accuracy_{k}")
        if value is not None:
            out[f"predict.accuracy_{k}"] = value
    return out


def agent_metrics(summaries: Sequence[AgentSummary]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in summaries:
        values = {
            "calls": s.calls,
            "failed": s.failed,
            "weighted_hit_ratio": s.weighted_hit_ratio,
            "recompute_burden": s.new_prefill_tokens,
            "cached_tokens": s.cached_tokens,
            "ttft_p50_ms": s.ttft_p50_ms,
            "ttft_p95_ms": s.ttft_p95_ms,
            "e2e_p50_ms": s.e2e_p50_ms,
            "e2e_p95_ms": s.e2e_p95_ms,
            "tpot_p50_ms": s.tpot_p50_ms,
        }
        out.update({f"{s.agent_id}.{k}": float(v) for k, v in values.items() if v is not None})
    return out
