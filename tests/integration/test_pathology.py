"""The KVFlow pathology (its Figure 1) on the real engine, from the engine's own KV events.

configs/kvflow-pathology.yaml: four agents with seven-block fixed prompts in a cache too small
for all four. Under LRU, each call evicts the prefix of the agent that runs next: the Executor's
call evicts the Expresser's blocks and the Expresser's next call recomputes them. The same
workload with an ample cache (the session's engine) evicts nothing of this run.
"""

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import ROOT, Up, free_port

pytestmark = pytest.mark.engine
BLOCK = 128  # vLLM CPU's block size


def config(tmp: Path, engine: dict[str, Any]) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "kvflow-pathology.yaml").read_text())
    cfg["engine"] = engine
    cfg["runs_dir"] = str(tmp / "runs")
    path = tmp / "pathology.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(up: Up, path: Path) -> Path:
    result = up.cli("run", str(path), timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = (path.parent / "runs").glob("kvflow-pathology-*")
    return run_dir


@pytest.fixture(scope="module")
def tight(up: Up, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("tight")
    shipped = yaml.safe_load((ROOT / "configs" / "kvflow-pathology.yaml").read_text())["engine"]
    engine = shipped | {"port": free_port(), "kv_events_port": free_port(2)}
    return run(up, config(tmp, engine))  # its own engine: the capacity differs


def test_executor_evicts_expresser_and_expresser_recomputes(tight: Path) -> None:
    evictions = json.loads((tight / "summary.json").read_text())["evictions"]
    cells = {(c["evictor_agent_id"], c["victim_agent_id"]): c for c in evictions["matrix"]}
    cell = cells[("executor", "expresser")]
    assert cell["same_workflow"] == cell["evictions"] and cell["harmful"] > 0
    rows = pq.read_table(tight / "requests.parquet").to_pylist()
    missed = [r for r in rows if r["agent_id"] == "expresser" and r["turn_id"] > 1]
    assert missed and all(r["uncached_evicted_tokens"] > 0 for r in missed)
    # The recompute charged to Executor -> Expresser is the Expresser rows' uncached prompt,
    # within one block (the rest is the new dynamic suffix).
    uncached = sum(r["prompt_tokens"] - r["cached_tokens"] for r in missed)
    assert 0 <= uncached - cell["recomputed_tokens"] < BLOCK * len(missed)
    blocks = pq.read_table(tight / "blocks.parquet").to_pylist()
    harmful = [b for b in blocks if b["harmful"] and b["owner_agent_id"] == "expresser"]
    assert harmful and all(b["evictor_agent_id"] == "executor" for b in harmful)
    assert all(b["evictor_inferred"] for b in harmful)
    assert {b["needed_by_transition"] for b in harmful} == {"executor -> expresser"}
    assert (tight / "evictions.png").stat().st_size > 10_000
    kv = json.loads((tight / "summary.json").read_text())["kv_events"]
    assert kv["missing_batches"] == 0


def test_provenance_adds_up_on_every_row(tight: Path) -> None:
    for r in pq.read_table(tight / "requests.parquet").to_pylist():
        kinds = ("self", "cross_agent", "cross_workflow", "unattributed")
        cached = sum(r[f"cached_{k}_tokens"] for k in kinds)
        uncached = sum(r[f"uncached_{k}_tokens"] for k in ("evicted", "layout", "cold"))
        assert (cached, uncached) == (r["cached_tokens"], r["prompt_tokens"] - r["cached_tokens"])
        assert r["cached_unattributed_tokens"] == 0  # every hit block's store event was seen
        assert r["fixed_prefix_tokens"] == 7 * BLOCK  # the config's exact block alignment


def test_ample_cache_evicts_nothing(up: Up, tmp_path: Path) -> None:
    run_dir = run(up, config(tmp_path, up.engine_config))  # the session engine: 8,192 tokens
    evictions = json.loads((run_dir / "summary.json").read_text())["evictions"]
    assert evictions["matrix"] == [] and evictions["summary"]["blocks_evicted"] == 0
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    later = [r for r in rows if r["turn_id"] > 1]
    assert all(r["uncached_evicted_tokens"] == 0 for r in later)
    assert all(r["cached_tokens"] == 7 * BLOCK for r in later)


def test_replay_reproduces_the_run_and_steps_to_execution_removes_the_harm(
    up: Up, tight: Path
) -> None:
    """`kvscope replay` on the fresh run: LRU at the run's capacity is what the engine measured
    request by request; KVFlow's policy keeps the Expresser's prefix from the Executor; Belady
    hits at least as much as every other policy."""
    out = tight.parent / "replay-results.json"
    result = up.cli("replay", str(tight), "--json", str(out), "--no-mlflow", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    fidelity = json.loads((tight / "replay.json").read_text())["fidelity"]
    assert fidelity["meets_targets"], fidelity
    assert fidelity["exact_share"] >= 0.99 and fidelity["weighted_difference"] <= 0.01
    by_policy = {r["policy"]: r for r in json.loads(out.read_text())}
    assert set(by_policy) == {"lru", "steps-to-execution", "predicted-next-agent", "belady"}
    pairs = {
        p: {(h["evictor_agent"], h["victim_agent"]) for h in r["harm"]}
        for p, r in by_policy.items()
    }
    assert ("executor", "expresser") in pairs["lru"]
    assert ("executor", "expresser") not in pairs["steps-to-execution"]
    best = by_policy["belady"]["cached_tokens"]
    assert all(r["cached_tokens"] <= best for r in by_policy.values())
    assert by_policy["belady"]["cached_tokens"] > by_policy["lru"]["cached_tokens"]
