"""Apps of other agent frameworks, each in a virtualenv of its own without kvscope (the lite
probe), profiled on the real engine: `kvscope profile -- <venv>/bin/python examples/<app>.py`.
Rows are the engine's calls (reconcile exact), the agents named as the framework names them,
transitions, one workflow and one trace per framework run."""

import json
from pathlib import Path
from typing import Any

import pytest
from framework_venv import framework_python
from helpers import ROOT, Up
from test_profile import profile_cli, rows_of

pytestmark = pytest.mark.engine


def _profiled(up: Up, tmp_path: Path, python: Path, *program: str) -> dict[str, Any]:
    done, run_dir = profile_cli(up, tmp_path, str(python), *program)
    assert done.returncode == 0, done.stderr[-3000:]
    probes = {json.loads(p.read_text()).get("probe") for p in run_dir.glob("probe.*.json")}
    assert probes == {"lite"}, probes  # kvscope is not installed in the app's venv
    assert "reconcile prompt_tokens_total" in done.stderr
    for line in done.stderr.splitlines():
        if line.startswith("reconcile "):
            assert line.endswith(": exact"), line
    return {"done": done, "run_dir": run_dir, "rows": rows_of(run_dir)}


def _workflows(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in rows:  # rows_of: by start
        runs.setdefault(r["workflow_run_id"], []).append(r)
    return list(runs.values())


def test_an_autogen_team_in_its_own_venv(up: Up, tmp_path: Path) -> None:
    python = framework_python("autogen")
    app = str(ROOT / "examples" / "autogen_app.py")
    got = _profiled(up, tmp_path, python, app, "--tasks", "2", "--messages", "4")
    rows = got["rows"]
    assert rows and all(r["status"] == "ok" for r in rows)
    runs = _workflows(rows)
    assert len(runs) == 2 and None not in {r["workflow_run_id"] for r in rows}  # a team.run each
    for run in runs:  # round robin: planner -> writer -> critic (the task message is the 1st)
        assert [r["agent_id"] for r in run] == ["planner", "writer", "critic"]
        assert [r["previous_agent_id"] for r in run] == [None, "planner", "writer"]
        assert [r["graph_node"] for r in run] == [
            "writers_room/planner", "writers_room/writer", "writers_room/critic"
        ]  # fmt: skip
        assert {r["turn_id"] for r in run} == {1}
    assert "traces: 2 written of 2 workflows" in got["done"].stderr


def test_a_crewai_crew_in_its_own_venv(up: Up, tmp_path: Path) -> None:
    python = framework_python("crewai")
    app = str(ROOT / "examples" / "crewai_app.py")
    got = _profiled(up, tmp_path, python, app, "--topics", "2")
    rows = got["rows"]
    assert rows and all(r["status"] == "ok" for r in rows)
    runs = _workflows(rows)
    assert len(runs) == 2 and None not in {r["workflow_run_id"] for r in rows}  # a kickoff each
    for run in runs:  # sequential: one task per agent, in order
        assert [r["agent_id"] for r in run] == ["researcher", "writer", "editor"]
        assert [r["previous_agent_id"] for r in run] == [None, "researcher", "writer"]
        assert [r["graph_node"] for r in run] == [
            "researcher/research", "writer/write", "editor/edit"
        ]  # fmt: skip
        assert {r["turn_id"] for r in run} == {1}
    assert "traces: 2 written of 2 workflows" in got["done"].stderr
