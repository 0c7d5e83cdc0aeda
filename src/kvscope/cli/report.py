"""`kvscope report` and `compare`: HTML views of one run, or of several side by side.

A RUN is a run directory or an MLflow run id. An id is looked up in the tracking store (the
local one under --runs-dir unless --tracking-uri says otherwise); its run directory is
--runs-dir/<benchmark_run_id> when that exists, else the run's artifacts are downloaded there.
"""

from pathlib import Path
from typing import Annotated

import typer

from kvscope.cli.common import console, friendly
from kvscope.errors import KvscopeError

RUNS_DIR_OPTION = typer.Option(help="The runs directory (and its local MLflow store).")
TRACKING_OPTION = typer.Option(help="MLflow tracking URI for run ids (default: local store).")


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
    from kvscope.mlflow_runs import resolve_run
    from kvscope.report.pages import run_report

    run_dir = resolve_run(run, runs_dir, tracking_uri)
    path = run_report(run_dir, out)
    console.print(f"report: {path}")
    if not no_mlflow:
        logged(run_dir, [path], tracking_uri)


def logged(run_dir: Path, paths: list[Path], tracking_uri: str | None) -> None:
    """Add files to the run's MLflow run, and say so (or why not: they stay in the run)."""
    from kvscope.mlflow_runs import log_files

    try:
        run_id = log_files(run_dir, paths, tracking_uri)
    except KvscopeError as err:
        console.print(f"not logged to MLflow: {err}", highlight=False)
        return
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
    from kvscope.mlflow_runs import resolve_run
    from kvscope.report.pages import compare_report

    run_dirs = [resolve_run(r, runs_dir, tracking_uri) for r in runs]
    console.print(f"compare: {compare_report(run_dirs, out)}")
