"""publish(): one RunAnalysis -> summary.json, figures, report.html and the MLflow run's metrics,
files and trace audit (a recorded run, a stand-in for MLflow)."""

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import ROOT

from kvscope.analysis.run import RunAnalysis, analyze_run
from kvscope.finalize import finalize
from kvscope.probe.tracing import TraceAudit
from kvscope.publish import WorkloadOutcome, publish, run_metrics
from kvscope.records import run_dir as files
from kvscope.records.status import RunStatus, write_status

RUN = "fixture-pressure-20261123-190437-ee5775"  # evictions, exact reconciliation


@dataclass
class FakeTracking:
    """What publish asks of kvscope.probe.tracing.TrackingRun."""

    run_id: str = "mlflow-run-1"
    tracking_uri: str = "sqlite:///nowhere.db"
    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    finished: tuple[int, str] | None = None
    tags: dict[str, str] = field(default_factory=dict)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)

    def log_artifact(self, path: Path) -> None:
        assert path.exists()
        self.artifacts.append(path.name)

    def finish(self, expected: int, status: str = "FINISHED") -> TraceAudit:
        self.finished = (expected, status)
        return TraceAudit(expected, expected, 0)


@pytest.fixture
def analysis(tmp_path: Path) -> RunAnalysis:
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, tmp_path / RUN)
    finalize(tmp_path / RUN)
    return analyze_run(tmp_path / RUN)


def test_every_file_renders_the_one_analysis(analysis: RunAnalysis) -> None:
    tracking = FakeTracking()
    outcome = publish(analysis, tracking, WorkloadOutcome(2, 0, 0), traces=False)  # type: ignore[arg-type]
    assert tracking.tags["kvscope.status"] == "unknown"  # recorded before runs had a status
    run_dir = analysis.run_dir
    assert json.loads((run_dir / files.SUMMARY_JSON).read_text()) == json.loads(
        json.dumps(analysis.summary())
    )
    for name in (files.REPORT_HTML, files.TIMELINE_PNG, files.EVICTIONS_PNG):
        assert (run_dir / name).stat().st_size > 0, name
    # the MLflow run: the same numbers, every file that exists, in the artifacts' order
    planner = analysis.agents[0]
    assert tracking.metrics["planner.weighted_hit_ratio"] == planner.weighted_hit_ratio
    assert tracking.metrics["all.recompute_burden"] == analysis.total.new_prefill_tokens
    assert tracking.metrics["kv.blocks_evicted"] == analysis.eviction_summary()["blocks_evicted"]
    assert tracking.metrics["workflows_run"] == 2.0
    assert tracking.artifacts == [n for n in files.ARTIFACTS if (run_dir / n).exists()]
    assert files.SUMMARY_JSON in tracking.artifacts and files.REPORT_HTML in tracking.artifacts
    assert tracking.finished == (0, "FINISHED")  # traces off: none expected (test_traces.py)
    assert (outcome.mlflow_run_id, outcome.error) == ("mlflow-run-1", None)
    assert outcome.benchmark_run_id == analysis.benchmark_run_id == RUN


def test_a_failed_run_ends_its_mlflow_run_failed(analysis: RunAnalysis) -> None:
    tracking = FakeTracking()
    outcome = publish(analysis, tracking, WorkloadOutcome(), failure=KeyboardInterrupt(),  # type: ignore[arg-type]
                      traces=False)  # fmt: skip
    assert tracking.finished == (0, "FAILED")  # the traces expected: test_traces.py
    assert outcome.error == "KeyboardInterrupt"


def test_a_run_whose_engine_died_is_failed_everywhere(analysis: RunAnalysis) -> None:
    rows = analysis.requests.select(["status", "end_ns"]).to_pylist()
    died_at = sorted(r["end_ns"] for r in rows)[3]  # after the 4th call
    status = RunStatus.of(rows, death=(died_at, "the engine process exited with status -9"),
                          planned=4, ran=2)  # fmt: skip
    write_status(analysis.run_dir, status)
    again = analyze_run(analysis.run_dir)
    tracking = FakeTracking()
    outcome = publish(again, tracking, WorkloadOutcome(2, 0, 0, 4), traces=False)  # type: ignore[arg-type]
    assert tracking.finished == (0, "FAILED") and tracking.tags["kvscope.status"] == "engine_died"
    assert outcome.error == status.reason and "after 4 successful call(s)" in outcome.error
    summary = json.loads((analysis.run_dir / "summary.json").read_text())
    assert summary["status"]["state"] == "engine_died"
    assert summary["status"]["workflows_not_run"] == 2


def test_unknown_workload_counts_are_left_out_not_zero(analysis: RunAnalysis) -> None:
    metrics = run_metrics(analysis, WorkloadOutcome())
    assert not {"workflows_run", "workflows_failed", "unparsed_verdicts"} & set(metrics)
    assert metrics["reconcile.cached_tokens_total.difference"] == 0.0
    assert metrics["predict.distinct_sequences"] == 1.0
    assert metrics["predict.accuracy_1"] == 1.0  # the second workflow repeats the first


def test_calls_without_agent_thread_or_workflow_are_analysed_and_drawn(tmp_path: Path) -> None:
    """An app's calls made outside any graph (agent, thread, workflow unknown) are rows like any
    other: every table, figure and the report take them, and they are never dropped."""
    run_dir = tmp_path / RUN
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / RUN, run_dir)
    path = run_dir / "requests.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows[::3]:
        row.update(agent_id=None, previous_agent_id=None, thread_id=None, workflow_run_id=None,
                   turn_id=None, graph_node=None, workflow_concurrency=None)  # fmt: skip
    for row in rows[1::3]:
        row["agent_id"] = "my custom agent"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    finalize(run_dir)
    analysis = analyze_run(run_dir)
    assert analysis.rows == len(rows)
    assert sum(a.calls for a in analysis.agents) == len(rows)
    assert {a.agent_id for a in analysis.agents} >= {None, "my custom agent"}
    tracking = FakeTracking()
    publish(analysis, tracking, WorkloadOutcome(), traces=False)  # type: ignore[arg-type]
    for name in (files.REPORT_HTML, files.TIMELINE_PNG, files.SUMMARY_JSON):
        assert (run_dir / name).stat().st_size > 0, name
    assert not (run_dir / files.REPORT_ERROR).exists()
    assert tracking.metrics["my custom agent.calls"] == len(rows[1::3])
