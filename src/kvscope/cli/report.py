"""`kvscope report` and `compare`: HTML views of one run, or of several side by side.

A RUN is a run directory or an MLflow run id. An id is looked up in the tracking store (the
local one under --runs-dir unless --tracking-uri says otherwise); its run directory is
--runs-dir/<benchmark_run_id> when that exists, else the run's artifacts are downloaded there.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvscope.cli.common import console, friendly
from kvscope.errors import KvscopeError
from kvscope.records import requests
from kvscope.records.run_dir import read_run_json

if TYPE_CHECKING:
    from mlflow import MlflowClient

RUNS_DIR_OPTION = typer.Option(help="The runs directory (and its local MLflow store).")
TRACKING_OPTION = typer.Option(help="MLflow tracking URI for run ids (default: local store).")


def _client(uri: str) -> "MlflowClient | None":
    """An MLflow client for `uri`; None for a local SQLite store that does not exist (an
    MlflowClient would create an empty one)."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return None
    from mlflow import MlflowClient

    return MlflowClient(uri)


def resolve_run(ref: str, runs_dir: Path, tracking_uri: str | None = None) -> Path:
    """The run directory of RUN: the directory itself, or the one of an MLflow run id."""
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


@friendly
def report(
    run: Annotated[str, typer.Argument(help="A run directory, or an MLflow run id.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Where to write (default RUN/report.html).")
    ] = None,
    no_mlflow: Annotated[
        bool, typer.Option("--no-mlflow", help="Do not log report.html to the run's MLflow run.")
    ] = False,
    runs_dir: Annotated[Path, RUNS_DIR_OPTION] = Path("runs"),
    tracking_uri: Annotated[str | None, TRACKING_OPTION] = None,
) -> None:
    """Write a self-contained HTML report of one run (RUN/report.html)."""
    import logging

    from kvscope.report.pages import run_report

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    run_dir = resolve_run(run, runs_dir, tracking_uri)
    path = run_report(run_dir, out)
    console.print(f"report: {path}")
    if no_mlflow:
        return
    try:
        client, run_id = mlflow_run_of(run_dir, tracking_uri)
    except KvscopeError as err:
        console.print(f"not logged to MLflow: {err}", highlight=False)
        return
    client.log_artifact(run_id, str(path))
    console.print(f"logged to MLflow run {run_id}")


@friendly
def compare(
    runs: Annotated[list[str], typer.Argument(help="Run directories or MLflow run ids.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")] = Path(
        "compare.html"
    ),
    runs_dir: Annotated[Path, RUNS_DIR_OPTION] = Path("runs"),
    tracking_uri: Annotated[str | None, TRACKING_OPTION] = None,
) -> None:
    """Compare runs in one HTML page: each run's views side by side, plus RQ3, RQ4 and RQ5."""
    from kvscope.report.pages import compare_report

    run_dirs = [resolve_run(r, runs_dir, tracking_uri) for r in runs]
    console.print(f"compare: {compare_report(run_dirs, out)}")
