"""`kvscope log RUN`: a finished run directory into MLflow afterwards (the run is local-first).

    result = upload(run_dir, tracking_uri=None)   # the run's own store unless told otherwise

The MLflow run gets what `kvscope run` would have logged: the params kept in run.json, the
metrics of the run's analysis (with the workload counts run.json kept), its files, its traces
and its status. Idempotent: a run with the same benchmark_run_id already logged in full (tag
kvscope.logged) is left as it is and named; one cut off mid-upload (no such tag) is deleted, with
its traces, and logged again. Never two MLflow runs for one run directory.
"""

from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient

from kvscope.analysis.run import analyze_run
from kvscope.config import ExperimentConfig, TrackingConfig
from kvscope.errors import KvscopeError
from kvscope.finalize import finalize
from kvscope.probe.tracing import TrackingRun, unreachable
from kvscope.publish import LOGGED_TAG, WorkloadOutcome, publish
from kvscope.records import requests
from kvscope.records.run_dir import read_run_json


@dataclass(frozen=True)
class Upload:
    run_id: str  # the MLflow run's id
    tracking_uri: str
    already: bool  # it was logged before: nothing was written
    replaced: int  # MLflow runs of this run directory that were cut off, deleted first


def upload(run_dir: Path, tracking_uri: str | None = None) -> Upload:
    run = read_run_json(run_dir)
    if "config" not in run or "benchmark_run_id" not in run:
        raise KvscopeError(f"{run_dir} has no run.json from kvscope run / profile: nothing to log")
    cfg = ExperimentConfig.model_validate(run["config"])
    tracking_cfg = TrackingConfig(
        tracking_uri=tracking_uri or cfg.tracking.tracking_uri,
        experiment=cfg.tracking.experiment,
        traces=cfg.tracking.traces,
    )
    if tracking_cfg.tracking_uri and (problem := unreachable(tracking_cfg.tracking_uri)):
        raise KvscopeError(problem)
    tracking = TrackingRun.open(tracking_cfg, run_dir.resolve().parent)
    benchmark_id = run["benchmark_run_id"]
    done, cut = _earlier(tracking.client, tracking.experiment_id, benchmark_id)
    if done is not None:
        return Upload(done, tracking.tracking_uri, already=True, replaced=0)
    for run_id in cut:
        _delete(tracking.client, tracking.experiment_id, run_id)
    if not requests.exists(run_dir):
        finalize(run_dir)
    engine = (run.get("config") or {}).get("engine", {}).get("kind", "unknown")
    tracking.start(benchmark_id, run.get("mlflow_params") or {},
                   {"benchmark_run_id": benchmark_id, "engine": engine})  # fmt: skip
    known = {k: v for k, v in (run.get("workload") or {}).items() if k in _WORKLOAD_FIELDS}
    outcome = publish(analyze_run(run_dir), tracking, WorkloadOutcome(**known),
                      traces=tracking_cfg.traces)  # fmt: skip
    if outcome.mlflow_error:
        raise KvscopeError(f"{benchmark_id} not logged: {outcome.mlflow_error}")
    assert outcome.mlflow_run_id is not None
    return Upload(outcome.mlflow_run_id, tracking.tracking_uri, already=False, replaced=len(cut))


_WORKLOAD_FIELDS = ("workflows", "failed", "unparsed_verdicts", "planned")


def _earlier(
    client: MlflowClient, experiment_id: str, benchmark_id: str
) -> tuple[str | None, list[str]]:
    """(the MLflow run that holds this run in full, or None; the ones cut off mid-upload)."""
    found = client.search_runs([experiment_id], f"tags.benchmark_run_id = '{benchmark_id}'")
    done = [r.info.run_id for r in found if r.data.tags.get(LOGGED_TAG) == "true"]
    if done:
        return done[0], []
    return None, [r.info.run_id for r in found]


def _delete(client: MlflowClient, experiment_id: str, run_id: str) -> None:
    """A cut-off MLflow run and every trace linked to it (found page by page, all of them
    before any is deleted: deleting would shift the pages; then deleted PAGE at a time)."""
    ids: list[str] = []
    token: str | None = None
    while True:
        page = client.search_traces(
            locations=[experiment_id],
            run_id=run_id,
            include_spans=False,
            max_results=PAGE,
            page_token=token,
        )
        ids += [t.info.trace_id for t in page]
        token = page.token
        if not token:
            break
    for i in range(0, len(ids), PAGE):
        client.delete_traces(experiment_id, trace_ids=ids[i : i + PAGE])
    client.delete_run(run_id)


PAGE = 100  # traces found or deleted per MLflow call
