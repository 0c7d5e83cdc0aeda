"""The compare report's eviction-hints section: arms, baselines, and each run's live numbers
beside its own replay and its baseline's prediction (report/hints_section.py)."""

import json
import shutil
from pathlib import Path

from helpers import ROOT

from kvscope.analysis.run import RunAnalysis, analyze_run
from kvscope.replaying import replay_run
from kvscope.report.hints_section import baselines, hints_section
from kvscope.report.table import NULL
from kvscope.sim.hints import offline_priorities
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.simulate import simulate

PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology-sglang"


def arm(tmp: Path, name: str, policy: str, hints: str | None, capacity: int = 3072) -> Path:
    run = shutil.copytree(PATHOLOGY, tmp / name)
    info = json.loads((run / "run.json").read_text())
    info["config"]["engine"] |= {"eviction_policy": policy, "kv_capacity_tokens": capacity}
    if hints:
        info["config"]["eviction_hints"] = hints
    (run / "run.json").write_text(json.dumps(info))
    return run


def analyzed(*runs: Path) -> list[RunAnalysis]:
    return [analyze_run(r, r.name) for r in runs]


def recompute(run: Path, policy: str) -> int:
    trace = load_source(run).trace
    capacity = (trace.capacity_tokens or 0) // trace.block_size
    if policy.endswith("-hints"):
        level = policy.removesuffix("-hints")
        ranked = offline_priorities(trace, level)
        cached = simulate(trace, "priority", capacity, engine="sglang", priorities=ranked)
    else:
        cached = simulate(trace, policy, capacity, engine="sglang")
    return int(trace.prompt_tokens.sum() - cached.cached_blocks.sum() * trace.block_size)


def cells(data: list[RunAnalysis]) -> dict[str, dict[str, str]]:
    section = hints_section(data)
    assert section is not None
    table = section.tables[0]
    return {row[0]: dict(zip(table.headers, row, strict=True)) for row in table.rows}


def test_no_section_unless_the_runs_differ_in_policy_or_hints(tmp_path: Path) -> None:
    a, b = arm(tmp_path, "a", "lru", None), arm(tmp_path, "b", "lru", None, 4096)
    assert hints_section(analyzed(a, b)) is None
    assert hints_section(analyzed(a)) is None


def test_each_arm_beside_its_replay_and_its_baselines_prediction(tmp_path: Path) -> None:
    lru = arm(tmp_path, "lru", "lru", None)
    steps = arm(tmp_path, "steps", "priority", "steps-to-execution")
    other = arm(tmp_path, "other", "priority", None, 4096)  # another setup: its own baseline
    hinted = arm(tmp_path, "hinted", "priority", "predicted-next", 4096)  # ... and this one's
    for run in (lru, steps):
        replay_run(run)
    data = analyzed(lru, steps, other, hinted)
    assert [b and b.label for b in baselines(data)] == ["lru", "lru", "other", "other"]
    got = cells(data)
    live = data[1].total.new_prefill_tokens
    assert got["steps"]["recompute burden"] == f"{live:,}"
    # the baseline's replay under the arm's hints, computed offline: the prediction
    predicted = recompute(lru, "steps-to-execution-hints")
    assert got["steps"]["predicted"] == f"{predicted:,}" and got["steps"]["baseline"] == "lru"
    assert got["steps"]["prediction error"] == f"{(predicted - live) / live:+.1%}"
    # the run's own replay: its policy with the priorities its calls carried (none here)
    assert got["steps"]["replayed"] == f"{recompute(steps, 'priority'):,}"
    assert got["lru"]["replayed"] == got["lru"]["predicted"] == f"{recompute(lru, 'lru'):,}"
    # no replay.json: null, never 0
    assert got["other"]["replayed"] == got["hinted"]["predicted"] == NULL
    assert got["hinted"]["baseline"] == "other"
    assert got["lru"]["harmful-eviction tokens"] == NULL  # no KV events in the fixture
    assert got["lru"]["next-agent predicted"] == "100.0%"  # a fixed cycle, once it was seen
    section = hints_section(data)
    assert section is not None and any("other" in n for n in section.notes)
    per_agent = section.tables[1]
    assert [r[1] for r in per_agent.rows if r[0] == "steps"] == [a.agent_id for a in data[1].agents]


def test_the_section_leads_the_compare_page(tmp_path: Path) -> None:
    from kvscope.report.pages import compare_report

    runs = [arm(tmp_path, "lru", "lru", None), arm(tmp_path, "p", "priority", "predicted-next")]
    replay_run(runs[0])
    html = compare_report(runs, tmp_path / "compare.html").read_text()
    assert "Eviction policy and hints" in html
    assert html.index("Eviction policy and hints") < html.index("RQ3")
