"""The routing views of a deployment's run: summary.json, the report's section, `kvscope
analyze`, and the compare report across runs. The run is test_finalize_replicas' hand-made
two-replica run (test_routing's calls), finalized; its answers are worked out there.
"""

import re
from dataclasses import replace
from pathlib import Path

import pytest
from test_deployment_tables import write_run
from typer.testing import CliRunner

from kvscope.analysis.run import RunAnalysis, analyze_run
from kvscope.cli import app
from kvscope.finalize import finalize
from kvscope.report.pages import compare_report
from kvscope.report.routing_section import routing_compare, routing_section


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunAnalysis:
    root = write_run(tmp_path_factory.mktemp("deployment"))
    finalize(root)
    return analyze_run(root)


def test_summary_has_the_routing_of_a_deployment(run: RunAnalysis) -> None:
    got = run.summary()["routing"]
    assert got["unplaced_calls"] == 1  # G
    by_agent = {a["group"]: a["routing_miss_tokens"] for a in got["by_agent"]}
    # B (executor) 8 on r0; C (planner) 4; E (executor) 0; F failed; G unplaced
    assert by_agent == {"planner": 4, "executor": 8, "reviewer": None}
    by_edge = {t["group"]: t["routing_miss_tokens"] for t in got["by_transition"]}
    assert by_edge["planner -> executor"] == 8 and by_edge["executor -> planner"] == 4
    affinity = {a["agent_id"]: (a["top_replica"], a["affinity"]) for a in got["affinity"]}
    assert affinity["planner"] == ("r0", 2 / 3)  # A, D on r0; C on r1
    assert affinity["executor"] == ("r0", 0.5)  # B on r1, E on r0: the tie goes to r0
    cells = {(x["agent_id"], x["replica"]): x["calls"] for x in got["per_agent_replica"]}
    assert cells[("reviewer", None)] == 1 and cells[("reviewer", "r1")] == 1


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub("<[^>]+>", " ", html))


def test_the_report_and_analyze_show_it(run: RunAnalysis, tmp_path: Path) -> None:
    (section,) = routing_section(run)
    assert section.image is not None  # the load each replica carried
    titles = [t.title for t in section.tables]
    assert titles[0] == "per agent x replica" and len(titles) == 4
    result = CliRunner().invoke(app, ["analyze", str(run.run_dir), "--rq", "2"])
    assert result.exit_code == 0, result.output
    assert "routing misses per transition" in result.output
    assert "planner -> executor" in result.output
    page = text(compare_report([run.run_dir, run.run_dir], tmp_path / "c.html").read_text())
    assert "Routing across runs" in page


def test_a_run_of_one_engine_has_no_routing(run: RunAnalysis, tmp_path: Path) -> None:
    single = replace(run, requests=run.requests.drop_columns(["replica"]))
    assert routing_section(single) == [] and routing_compare([single]) == []
    assert "routing" not in single.summary()


def test_each_replica_has_its_own_server_side(run: RunAnalysis) -> None:
    """No run-level series for a deployment: each replica's /metrics summary, and its counters
    reconciled against the calls placed on it (r0: A, D, E; r1: B, C and the failed F)."""
    assert [r.name for r in run.replicas] == ["r0", "r1"]
    r0, r1 = run.replicas
    assert r0.summary["kv_used_tokens_peak"] == 1000 and r1.summary["kv_used_tokens_peak"] == 2000
    checks = {(c.replica, c.counter): c for c in run.reconciliation}
    assert checks[("r0", "prompt_tokens_total")].exact is True  # 14 + 14 + 13
    assert checks[("r0", "cached_tokens_total")].exact is True  # 0 + 12 + 8
    assert checks[("r1", "prompt_tokens_total")].requests_sum == 27
    assert checks[("r1", "prompt_tokens_total")].unmeasured_rows == 1  # F failed
    assert checks[("r1", "cached_tokens_total")].difference == 2  # the engine counted 10, rows 8
    assert run.server == {"hit_rate_from_counters": 30 / 68}  # summed over the replicas
    assert "kv_used_tokens_peak" not in run.server  # two caches' use never added up
    doc = run.summary()["server_replicas"]
    assert doc["r1"]["summary"]["kv_used_tokens_peak"] == 2000
    cached = [c for c in doc["r1"]["reconciliation"] if c["counter"] == "cached_tokens_total"]
    assert cached[0]["difference"] == 2 and cached[0]["replica"] == "r1"
    single = replace(run, replicas=[])
    assert "server_replicas" not in single.summary()


def test_a_timeline_per_replica(run: RunAnalysis) -> None:
    """Each replica's KV use over time with the calls it served, in report.html and as
    replicas/<name>/timeline.png; no single timeline adds two caches' use."""
    from kvscope.publish import write_files
    from kvscope.report.run_sections import run_sections

    sections = {s.key: s for s in run_sections(run)}
    assert "timeline" not in sections
    assert sections["timeline-r0"].title == "KV usage over time: r0"
    assert sections["timeline-r0"].image and sections["timeline-r1"].image
    write_files(run)
    for name in ("r0", "r1"):
        assert (run.run_dir / "replicas" / name / "timeline.png").stat().st_size > 0
