"""`kvscope profile -- python examples/openai_agents.py` on the real engine: an OpenAI Agents SDK
app (triage hands off to billing, which calls a function tool), every call a row named by the
SDK's agent, the hand-off a transition, one workflow and one trace per `Runner.run`."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from framework_venv import framework_python
from helpers import ROOT, Up
from test_profile import profile_cli, rows_of

pytestmark = pytest.mark.engine
pytest.importorskip("agents")


def test_profile_names_the_agents_sdk_apps_agents(up: Up, tmp_path: Path) -> None:
    """Traced (thread = the run's group_id); the same app with the SDK's tracing disabled is
    tests/unit/probe/test_openai_agents_identity.py's (one engine run less in the suite)."""
    program = (sys.executable, str(ROOT / "examples" / "openai_agents.py"), "--questions", "2")
    done, run_dir = profile_cli(up, tmp_path, *program)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("] billing: invoice 2031") == 2  # the tool's result: the answer
    rows: list[dict[str, Any]] = rows_of(run_dir)
    assert all(r["status"] == "ok" and r["workflow_type"] == "openai-agents" for r in rows)
    assert f"{len(rows)} LLM calls in 2 workflows" in done.stderr  # rows = calls
    assert "reconcile prompt_tokens_total" in done.stderr and "exact" in done.stderr
    assert "traces: 2 written of 2 workflows" in done.stderr
    runs = list(dict.fromkeys(r["workflow_run_id"] for r in rows))
    assert len(runs) == 2 and len(rows) == 4
    for n, run in enumerate(runs, 1):
        mine = [r for r in rows if r["workflow_run_id"] == run]
        got = [(r["agent_id"], r["graph_node"], r["turn_id"], r["previous_agent_id"]) for r in mine]
        assert got == [("triage", "triage", 1, None), ("billing", "billing", 1, "triage")]
        assert {r["thread_id"] for r in mine} == {f"customer-{n}"}  # the run's group_id
        assert all(r["tool_ms"] is None for r in mine)  # billing's tool ran after its call


def test_profile_the_sdks_default_responses_model(up: Up, tmp_path: Path) -> None:
    """`--responses`: the SDK's default model posts to /v1/responses; every call a row named by
    its agent, the rows reconcile exactly with the engine. vLLM 0.32.0 does not enforce a named
    tool_choice there (it parses the call the model writes), so whether triage hands off is the
    model's choice: billing, where it appears, follows triage. The app runs from a virtualenv of
    its own with the SDK and not kvscope (the lite probe: its Responses streams recorded there,
    read by kvscope's own code here)."""
    python = framework_python("openai-agents")
    program = (str(python), str(ROOT / "examples" / "openai_agents.py"), "--questions", "2")
    done, run_dir = profile_cli(up, tmp_path, *program, "--responses")
    assert done.returncode == 0, done.stderr
    probes = {json.loads(p.read_text()).get("probe") for p in run_dir.glob("probe.*.json")}
    assert probes == {"lite"}, probes
    assert "not profiled" not in done.stderr  # the old "/v1/responses is not a row" warning
    rows: list[dict[str, Any]] = rows_of(run_dir)
    assert rows and all(r["status"] == "ok" for r in rows)
    assert f"{len(rows)} LLM calls in 2 workflows" in done.stderr  # rows = calls
    assert "reconcile prompt_tokens_total" in done.stderr and "exact" in done.stderr
    runs = list(dict.fromkeys(r["workflow_run_id"] for r in rows))
    assert len(runs) == 2
    for n, run in enumerate(runs, 1):
        mine = [r for r in rows if r["workflow_run_id"] == run]
        assert mine[0]["agent_id"] == "triage" and mine[0]["previous_agent_id"] is None
        assert all(r["previous_agent_id"] == "triage" for r in mine if r["agent_id"] == "billing")
        assert {r["agent_id"] for r in mine} <= {"triage", "billing"}
        assert {r["thread_id"] for r in mine} == {f"customer-{n}"}
    assert all(r["prompt_tokens"] and r["output_tokens"] and r["e2e_ms"] for r in rows)
    assert all(r["sglang_response_id"] == r["request_uuid"] for r in rows)  # vLLM's response id
