"""A finished run directory and its MLflow run, afterwards: find one from the other, add files.

    run_dir = resolve_run("runs/demo-...", runs_dir)    # or an MLflow run id (downloaded)
    run_id = log_files(run_dir, [run_dir / "report.html"])   # KvscopeError: no MLflow run

The MLflow run of a run directory is the one tagged with its benchmark_run_id, in the store
its config names (or the local one under the runs directory, or `tracking_uri`).
"""

from pathlib import Path
from typing import TYPE_CHECKING

from kvscope.errors import KvscopeError
from kvscope.records import requests
from kvscope.records.run_dir import read_run_json

if TYPE_CHECKING:
    from mlflow import MlflowClient


def _client(uri: str) -> "MlflowClient | None":
    """An MLflow client for `uri`; None for a local SQLite store that does not exist (an
    MlflowClient would create an empty one)."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return None
    from mlflow import MlflowClient

    return MlflowClient(uri)


def resolve_run(ref: str, runs_dir: Path, tracking_uri: str | None = None) -> Path:
    """The run directory of RUN: the directory itself, or the one of an MLflow run id
    (runs_dir/<benchmark_run_id> when it exists, else the run's artifacts downloaded there)."""
    path = Path(ref)
    if path.is_dir():
        if not requests.exists(path):
            raise KvscopeError(f"{path} has no request table: not a kvscope run directory")
        return path
    from mlflow.exceptions import MlflowException

    from kvscope.probe.tracing import local_store_uri

    uri = tracking_uri or local_store_uri(runs_dir)
    client = _client(uri)
    if client is None:
        raise KvscopeError(f"{ref} is not a directory, and there is no MLflow store at {uri}")
    try:
        run = client.get_run(ref)
    except MlflowException:
        raise KvscopeError(f"{ref} is neither a run directory nor an MLflow run in {uri}") from None
    benchmark_id = run.data.tags.get("benchmark_run_id") or ref
    target = runs_dir / benchmark_id
    if requests.exists(target):
        return target
    target.mkdir(parents=True, exist_ok=True)
    client.download_artifacts(ref, "", str(target))
    if not requests.exists(target):
        raise KvscopeError(f"MLflow run {ref} has no {requests.REQUESTS_PARQUET} artifact")
    return target


def mlflow_run_of(run_dir: Path, tracking_uri: str | None = None) -> tuple["MlflowClient", str]:
    """The MLflow run that logged this run directory (by its benchmark_run_id tag)."""
    info = read_run_json(run_dir)
    tracking = (info.get("config") or {}).get("tracking") or {}
    from kvscope.probe.tracing import local_store_uri

    uri = tracking_uri or tracking.get("tracking_uri") or local_store_uri(run_dir.parent)
    client = _client(uri)
    if client is None:
        raise KvscopeError(f"no MLflow store at {uri}")
    benchmark_id = info.get("benchmark_run_id") or run_dir.name
    found = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.benchmark_run_id = '{benchmark_id}'",
        max_results=1,
    )
    if not found:
        raise KvscopeError(f"no MLflow run tagged benchmark_run_id={benchmark_id} in {uri}")
    return client, found[0].info.run_id


def log_files(run_dir: Path, paths: list[Path], tracking_uri: str | None = None) -> str:
    """Add `paths` to the run directory's MLflow run as artifacts; that run's id. KvscopeError
    when it has none (the files stay in the run directory)."""
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    client, run_id = mlflow_run_of(run_dir, tracking_uri)
    for path in paths:
        client.log_artifact(run_id, str(path))
    return run_id
