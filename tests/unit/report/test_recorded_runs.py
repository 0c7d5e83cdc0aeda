"""Two runs recorded before the pipeline refactor: the code now gives the same numbers from the
same streams (tests/fixtures/recorded-runs/README.md says how they were recorded).

Each run's streams are finalized into a copy, analysed once, and what that analysis renders is
compared with what the earlier code wrote: summary.json, every table and note of report.html,
and the cross-run sections of the compare report.
"""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from typer.testing import CliRunner

from kvscope.analysis.run import RunAnalysis, analyze_run
from kvscope.cli import app
from kvscope.finalize import finalize
from kvscope.records.run_dir import run_name
from kvscope.report.compare_sections import cross_run_sections
from kvscope.report.pages import analyze_runs
from kvscope.report.run_sections import run_sections
from kvscope.report.table import Section

RECORDED = ROOT / "tests" / "fixtures" / "recorded-runs"
EXPECTED = RECORDED / "expected"
RUNS = sorted(p.name for p in RECORDED.iterdir() if p.is_dir() and p.name != "expected")
# Added after the recordings (summary.json key and report section): checked on their own below.
ADDED = "predictability"
STATUS = "status"  # summary.json's run status (issue 16): None for runs recorded before it
# kv_events' count of requests placed at their send time (queue time unknown), added after them.
QUEUE_UNKNOWN = "queue_unknown"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recorded")
    out = {}
    for name in RUNS:
        shutil.copytree(RECORDED / name, root / name)
        finalize(root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def analyses(runs: dict[str, Path]) -> dict[str, RunAnalysis]:
    return {name: analyze_run(path) for name, path in runs.items()}


def expected(name: str) -> Any:
    return json.loads((EXPECTED / name).read_text())


def as_json(value: Any) -> Any:
    """What json.dump would write, read back: tuples as lists, keys as strings."""
    return json.loads(json.dumps(value))


def test_two_runs_are_recorded() -> None:
    assert [run_name(n) for n in RUNS] == ["fixture", "fixture-pressure"]


@pytest.mark.parametrize("name", RUNS)
def test_summary_json_is_the_recorded_one(analyses: dict[str, RunAnalysis], name: str) -> None:
    got, want = as_json(analyses[name].summary()), expected(f"{name}.summary.json")
    assert got.keys() - want.keys() == {ADDED, STATUS} and got[STATUS] is None
    # Both recordings have every request's queue time (vLLM's request metrics).
    assert got["kv_events"].pop(QUEUE_UNKNOWN) == 0
    for key in want:
        assert got[key] == want[key], key


@pytest.mark.parametrize("name", RUNS)
def test_predictability_of_the_peer_runs(analyses: dict[str, RunAnalysis], name: str) -> None:
    """Both recorded runs: 2 PEER workflows of one cycle, the same agent sequence."""
    got = analyses[name].summary()[ADDED]
    assert (got["workflows"], got["distinct_sequences"]) == (2, 1)
    assert got["sequences"][0]["sequence"] == analyses[name].order
    everyone = got["accuracy"][-1]
    assert (everyone["agent_id"], everyone["predicted_1"], everyone["accuracy_1"]) == (
        "all",
        3,
        1.0,
    )
    assert all(r["returns"] == 0 and r["steps_p50"] is None for r in got["reuse"])


def test_the_pressure_run_has_what_the_comparison_needs(analyses: dict[str, RunAnalysis]) -> None:
    ample, pressed = (analyses[n] for n in RUNS)
    assert ample.kv_capacity_config is None and pressed.kv_capacity_config == 2048
    assert ample.evictions is not None and ample.evictions.num_rows == 0
    assert pressed.evictions is not None and pressed.evictions.num_rows > 0
    assert all(r.exact for r in pressed.reconciliation)


def dump(sections: list[Section]) -> list[dict[str, Any]]:
    """What a section says in words and numbers (its figure aside)."""
    return [
        {"key": s.key, "title": s.title, "intro": s.intro, "missing": s.missing,
         "notes": s.notes,
         "tables": [{"title": t.title, "headers": t.headers, "rows": t.rows, "note": t.note}
                    for t in s.tables]}
        for s in sections
    ]  # fmt: skip


@pytest.mark.parametrize("name", RUNS)
def test_report_sections_are_the_recorded_ones(analyses: dict[str, RunAnalysis], name: str) -> None:
    got, want = dump(run_sections(analyses[name])), expected(f"{name}.report.json")
    got = [s for s in got if s["key"] != ADDED]
    assert [s["key"] for s in got] == [s["key"] for s in want]
    for g, w in zip(got, want, strict=True):
        assert g == w, g["key"]


def test_compare_sections_are_the_recorded_ones(runs: dict[str, Path]) -> None:
    want = expected("compare.json")
    data = analyze_runs([runs[n] for n in RUNS])
    assert [d.label for d in data] == want["labels"]
    got = dump(cross_run_sections(data))
    assert [s["key"] for s in got] == [s["key"] for s in want["cross"]]
    for g, w in zip(got, want["cross"], strict=True):
        assert g == w, g["key"]


def test_analyze_prints_the_recorded_numbers(runs: dict[str, Path]) -> None:
    """`kvscope analyze` draws the same tables: every recorded cell of RQ1 is on the screen."""
    name = RUNS[1]
    result = CliRunner().invoke(app, ["analyze", str(runs[name]), "--rq", "1"])
    assert result.exit_code == 0, result.output
    printed = [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in result.output.splitlines()
        if line.startswith("│")
    ]
    for key in ("agents", "turns"):  # (the overview names the run by its short label here)
        section = next(s for s in expected(f"{name}.report.json") if s["key"] == key)
        for row in section["tables"][0]["rows"]:
            assert row in printed, (key, row)


def test_analyze_prints_the_predictability_tables(runs: dict[str, Path]) -> None:
    """`kvscope analyze --rq 2`: transitions, then the sequences, reuse distance and predictor."""
    result = CliRunner().invoke(app, ["analyze", str(runs[RUNS[0]]), "--rq", "2"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Next-agent predictability" in out and "distinct agent sequences" in out
    assert "planner > executor > expresser > reviewer" in out
    assert "reuse distance" in out and "accuracy +1" in out
