"""`kvscope report`, `compare` and `analyze` on hand-made runs, and MLflow run ids."""

from pathlib import Path

import pytest
from test_report_html import HITS_W0, make_run, workflow_rows
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.cli.analyze import split_args
from kvscope.errors import KvscopeError

runner = CliRunner()


def test_report_writes_the_html_without_mlflow(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run-a")
    result = runner.invoke(app, ["report", str(run), "--no-mlflow"])
    assert result.exit_code == 0, result.output
    assert (run / "report.html").exists()
    assert "report:" in result.output and "MLflow" not in result.output


def test_report_says_when_no_mlflow_run_is_found(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run-a")
    result = runner.invoke(app, ["report", str(run), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").exists()
    assert "not logged to MLflow: no MLflow store" in result.output
    assert not (tmp_path / "mlflow.db").exists()  # looking did not create a store


def test_compare_cli(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a", capacity=4096), make_run(tmp_path / "b", capacity=1024)
    out = tmp_path / "cmp" / "x.html"
    result = runner.invoke(app, ["compare", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "RQ4: cache pressure" in out.read_text()


def test_analyze_prints_the_chosen_questions(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run-a")
    result = runner.invoke(app, ["analyze", str(run), "--rq", "1", "2"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "RQ1: per agent" in out and "RQ2: transitions" in out
    assert "RQ6" not in out
    assert "10.8%" in out  # the planner's weighted hit ratio (design note example)
    assert "9,010" in out  # its recompute burden


def test_analyze_defaults_and_errors(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run-a")
    result = runner.invoke(app, ["analyze", str(run)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "RQ6: where workflow time goes" in result.output
    bad = runner.invoke(app, ["analyze", str(tmp_path / "nope")])
    assert bad.exit_code == 2
    assert "neither a run directory nor" in bad.stderr or "no MLflow store" in bad.stderr


def test_split_args(tmp_path: Path) -> None:
    assert split_args(["run", "2", "6"], ["1"]) == (["run"], [1, 2, 6])
    assert split_args(["a", "b"], ["3,5"]) == (["a", "b"], [3, 5])
    assert split_args(["a"], []) == (["a"], [])
    with pytest.raises(KvscopeError, match="no research question 7"):
        split_args(["a"], ["7"])
    with pytest.raises(KvscopeError, match="at least one run"):
        split_args(["1"], [])


@pytest.fixture
def mlflow_run(tmp_path: Path) -> tuple[Path, str]:
    """A local MLflow store under runs/ with one run that logged a run directory's artifacts
    (the run directory itself is elsewhere: a report by run id has to download it)."""
    from mlflow import MlflowClient

    from kvscope.probe.tracing import local_store_uri

    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    source = make_run(tmp_path / "elsewhere" / "bench-1", rows=workflow_rows("w0", HITS_W0))
    client = MlflowClient(local_store_uri(runs_dir))
    exp = client.create_experiment("x", artifact_location=(runs_dir / "mlartifacts").as_uri())
    run_id = client.create_run(exp, tags={"benchmark_run_id": "bench-1"}).info.run_id
    for name in ("requests.parquet", "run.json"):
        client.log_artifact(run_id, str(source / name))
    return runs_dir, run_id


def test_report_by_mlflow_run_id_downloads_and_logs(mlflow_run: tuple[Path, str]) -> None:
    from mlflow import MlflowClient

    from kvscope.probe.tracing import local_store_uri

    runs_dir, run_id = mlflow_run
    result = runner.invoke(app, ["report", run_id, "--runs-dir", str(runs_dir)])
    assert result.exit_code == 0, result.output
    assert (runs_dir / "bench-1" / "report.html").exists()  # the run directory, rebuilt
    assert f"logged to MLflow run {run_id}" in result.output
    logged = MlflowClient(local_store_uri(runs_dir)).list_artifacts(run_id)
    assert "report.html" in {a.path for a in logged}
    unknown = runner.invoke(app, ["report", "0123abcd", "--runs-dir", str(runs_dir)])
    assert unknown.exit_code == 2
    assert "neither a run directory nor an MLflow run" in unknown.stderr
