"""A profiling session that fails while it opens, on the session's real engine: the error the app
sees is the one that happened (not a missing stream of a run that never began), a run that got as
far as its streams is concluded with what it holds, and a run that did not leaves no MLflow run
open."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import Up
from mlflow import MlflowClient

import kvscope
import kvscope.finalize
from kvscope import capture
from kvscope.probe.mlflow_store import local_store_uri

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("engine_state")]


def mlflow_runs(runs: Path) -> list:
    if not (runs / "mlflow.db").exists():
        return []
    client = MlflowClient(local_store_uri(runs))
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def test_an_unreadable_tokenizer_is_the_error_and_nothing_is_left_open(
    up: Up, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(*_: object) -> None:
        raise OSError("tokenizer.json is not valid JSON")

    monkeypatch.setattr(capture, "_chat_tokenizer", unreadable)
    runs = tmp_path / "runs"
    session = kvscope.profile(name="broken", engine=up.engine_file(tmp_path), runs_dir=runs)
    with pytest.raises(OSError, match=r"tokenizer\.json is not valid JSON"), session:
        raise AssertionError("the session must not open")
    assert [r for r in mlflow_runs(runs) if r.info.status == "RUNNING"] == []
    assert not list(runs.glob("*/requests.parquet"))  # nothing was measured: nothing concluded


def test_a_failure_after_the_streams_exist_concludes_the_run_and_stays_the_error(
    up: Up, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def taken(*_: object) -> None:
        raise RuntimeError("the KV events port is taken")

    monkeypatch.setattr(capture.CaptureSession, "_start_collectors", taken)
    runs = tmp_path / "runs"
    session = kvscope.profile(name="half", engine=up.engine_file(tmp_path), runs_dir=runs)
    with pytest.raises(RuntimeError, match="port is taken"), session:
        raise AssertionError("the session must not open")
    (table,) = runs.glob("*/requests.parquet")  # concluded: an empty table, the run FAILED
    assert pq.read_table(table).num_rows == 0
    (run,) = mlflow_runs(runs)
    assert run.info.status == "FAILED"

    def unwritable(*_: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(kvscope.finalize, "finalize", unwritable)  # the conclusion fails too
    session = kvscope.profile(name="half", engine=up.engine_file(tmp_path), runs_dir=runs)
    with pytest.raises(RuntimeError, match="port is taken") as caught, session:
        raise AssertionError("the session must not open")
    assert any("No space left on device" in note for note in caught.value.__notes__)
    _, second = sorted(mlflow_runs(runs), key=lambda r: r.info.start_time)
    assert second.info.status == "FAILED"  # ended, not left open for the process's exit
