"""The shipped examples as a user's apps on a live SGLang: `kvscope profile --engine <SGLang
config>` (the session's engine, reused) and `--attach URL` (a server kvscope did not start:
the reconciliation baseline is read before the first call there too)."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from framework_venv import framework_python
from helpers import KVSCOPE, ROOT, Up

from kvscope.records.requests import PROVENANCE_COLUMNS

pytestmark = pytest.mark.engine


def profile(sglang: Up, tmp: Path, how: list[str], *program: str) -> tuple[str, Path]:
    runs = tmp / "runs"
    argv = [*KVSCOPE, "profile", *how, "--runs-dir", str(runs), "--", *program]
    done = subprocess.run(argv, env=sglang.env, capture_output=True, text=True, timeout=1200,
                          cwd=tmp)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (run_json,) = runs.glob("*/run.json")
    return done.stderr, run_json.parent


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    return pq.read_table(run_dir / "requests.parquet").to_pylist()


def check_measured(stderr: str, run_dir: Path, kv_events: bool = True) -> list[dict[str, Any]]:
    rows = rows_of(run_dir)
    assert rows and all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert r["prompt_token_source"] == "engine" and r["prompt_token_mismatch"] is False
        measured = [r[c] for c in PROVENANCE_COLUMNS]
        if kv_events:  # provenance: every prompt token accounted for by the KV events
            assert None not in measured and sum(measured) == r["prompt_tokens"], r
        else:  # attached by URL alone: no KV event endpoint, no provenance (null, never 0)
            assert measured == [None] * len(measured), r
    summary = json.loads((run_dir / "summary.json").read_text())
    recon = {r["counter"]: r for r in summary["reconciliation"]}
    for counter in ("prompt_tokens_total", "cached_tokens_total"):
        assert recon[counter]["difference"] == 0, recon[counter]
    assert "reconcile cached_tokens_total" in stderr and (run_dir / "report.html").exists()
    return rows


def test_the_supervisor_example_on_sglang_with_eviction_hints(sglang: Up, tmp_path: Path) -> None:
    """A LangGraph app whose agent order the model makes, profiled with eviction hints: every
    call carries a priority from the online predictor; the server itself says its policy (the
    session's is LRU), so the run warns that the hints change nothing there. The app runs from
    a virtualenv of its own without kvscope (the lite probe: SGLang's tags and the hints from
    the wire template, the rows made by kvscope's process)."""
    engine = tmp_path / "engine.yaml"
    engine.write_text(yaml.safe_dump(sglang.engine_config))
    python = str(framework_python("langgraph"))
    program = (python, str(ROOT / "examples" / "supervisor.py"), "--topics", "1")
    how = ["--engine", str(engine), "--eviction-hints", "predicted-next"]
    stderr, run_dir = profile(sglang, tmp_path, how, *program)
    probes = {json.loads(p.read_text()).get("probe") for p in run_dir.glob("probe.*.json")}
    assert probes == {"lite"}, probes
    rows = check_measured(stderr, run_dir)
    assert {"supervisor", "critic"} <= {r["agent_id"] for r in rows}
    assert all(r["queue_ms"] is not None and r["prefill_ms"] is not None for r in rows)
    assert "traces: 2 written of 2 workflows" in stderr
    levels = [r["engine_priority"] for r in rows]
    assert None not in levels and all(p % 2 == 0 and p >= 2 for p in levels)
    assert len(set(levels)) > 1  # ranked by the predictor, not one constant
    said = " ".join(stderr.split())  # the console wraps long lines
    assert "warning: eviction hints (predicted-next) change nothing here" in said
    assert "this server's is lru" in said  # its /get_server_info, live


APP = """
import os, openai
client = openai.OpenAI()
system = "You are a careful analyst of quarterly reports. " * 30
for question in ("Revenue?", "Margin?", "Outlook?"):
    client.chat.completions.create(
        model=os.environ["KVSCOPE_MODEL"], max_tokens=4, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
    )
"""


def test_an_app_attached_to_sglang_reconciles_from_a_baseline_before_its_first_call(
    sglang: Up, tmp_path: Path
) -> None:
    """Attached by URL: SGLang lists its cached-token counter only from the first hit, which
    must still count (the reconciliation's baseline is the scrape before the first call)."""
    app = tmp_path / "app.py"
    app.write_text(APP)
    stderr, run_dir = profile(sglang, tmp_path, ["--attach", sglang.base], sys.executable, str(app))
    rows = check_measured(stderr, run_dir, kv_events=False)
    assert len(rows) == 3 and rows[0]["cached_tokens"] < rows[1]["cached_tokens"]
