"""`kvscope profile -- python examples/functional.py` on the real engine: a LangGraph Functional
API app (`@entrypoint`, `@task`), every call a row named by its task, one trace per invocation."""

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, Up
from test_profile import profile_cli, rows_of

pytestmark = pytest.mark.engine


def test_profile_names_the_functional_apps_tasks(up: Up, tmp_path: Path) -> None:
    program = (sys.executable, str(ROOT / "examples" / "functional.py"), "--topics", "1")
    done, run_dir = profile_cli(up, tmp_path, *program)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("[tides]") == 2
    rows: list[dict[str, Any]] = rows_of(run_dir)
    assert all(r["status"] == "ok" and r["workflow_type"] == "functional" for r in rows)
    assert f"{len(rows)} LLM calls in 2 workflows" in done.stderr  # rows = calls
    assert "reconcile prompt_tokens_total" in done.stderr and "exact" in done.stderr
    assert "traces: 2 written of 2 workflows" in done.stderr
    invocations = list(dict.fromkeys(r["workflow_run_id"] for r in rows))
    assert len(invocations) == 2 and {r["thread_id"] for r in rows} == {"topic-tides"}
    for turn, invocation in enumerate(invocations, 1):
        mine = [r for r in rows if r["workflow_run_id"] == invocation]
        assert {r["thread_turn"] for r in mine} == {turn}
        got = [(r["agent_id"], r["turn_id"], r["previous_agent_id"]) for r in mine]
        assert got[:5] == [("researcher", 1, None)] * 3 + [
            ("writer", 1, "researcher"),  # after the three launched together
            ("reviewer", 1, "writer"),
        ]
        assert got[5:] in ([], [("writer", 2, "reviewer")])  # a revision if the review asked
        assert {r["graph_node"] for r in mine[:3]} == {"workflow/researcher"}
