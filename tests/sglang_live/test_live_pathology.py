"""The KVFlow pathology on a live SGLang (configs/kvflow-pathology-sglang.yaml), and everything
kvscope measures of it from SGLang itself: exact reconciliation, each call's prompt ids from the
engine and its provenance, SGLang's own queue / prefill / decode per call, every KV event batch,
evictions equal to `sglang:evicted_tokens_total`, and a replay that reproduces the cached tokens.
"""

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import Up
from sglang_session import PATHOLOGY

from kvscope.replaying import plan_of, replay_document
from kvscope.sim.inputs.sources import load_source

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def run(sglang: Up, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("pathology")
    cfg = yaml.safe_load(PATHOLOGY.read_text())
    cfg["engine"] = sglang.engine_config  # the session's SGLang: `run` reuses it
    cfg["workload"]["cycles"] = 2  # the Expresser's second call pays for the first's eviction
    cfg["runs_dir"] = str(tmp / "runs")
    path = tmp / "pathology.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = sglang.cli("run", str(path), timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = (tmp / "runs").glob("kvflow-pathology-sglang-*")
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"dir": run_dir, "rows": rows, "summary": summary, "stdout": result.stdout}


def test_every_call_is_measured_by_sglang_itself(run: dict[str, Any]) -> None:
    rows = run["rows"]
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert r["prompt_token_source"] == "engine" and not r["prompt_token_mismatch"], r
        assert r["cached_self_tokens"] is not None, r  # provenance for every call
        # SGLang's request-metrics export, joined by rid
        assert r["queue_ms"] is not None and r["prefill_ms"] > 0 and r["decode_ms"] > 0, r
    recon = {r["counter"]: r for r in run["summary"]["reconciliation"]}
    for counter in ("prompt_tokens_total", "cached_tokens_total"):
        assert recon[counter]["difference"] == 0, recon[counter]
    events = json.loads((run["dir"] / "kv_events.summary.json").read_text())
    assert events["batches"] > 0 and events["lost"] == 0 and events["gaps"] == []


def test_executor_evicts_expresser_and_expresser_recomputes(run: dict[str, Any]) -> None:
    cells = {(c["evictor_agent_id"], c["victim_agent_id"]): c
             for c in run["summary"]["evictions"]["matrix"]}  # fmt: skip
    cell = cells[("executor", "expresser")]
    assert cell["harmful"] > 0 and cell["recomputed_tokens"] > 0
    missed = [r for r in run["rows"] if r["agent_id"] == "expresser" and r["turn_id"] > 1]
    assert missed and all(r["uncached_evicted_tokens"] > 0 for r in missed)
    blocks = pq.read_table(run["dir"] / "blocks.parquet").to_pylist()
    harmful = [b for b in blocks if b["harmful"] and b["owner_agent_id"] == "expresser"]
    assert harmful and all(b["evictor_agent_id"] == "executor" for b in harmful)


def test_evictions_agree_with_the_engines_counter(run: dict[str, Any]) -> None:
    recon = {r["counter"]: r for r in run["summary"]["reconciliation"]}
    evicted = recon["evicted_tokens_total"]  # KV events' evicted blocks vs sglang's counter
    assert evicted["source"] == "kv_events" and evicted["engine_delta"] > 0
    assert evicted["difference"] == 0, evicted
    assert "reconcile evicted_tokens_total: kv events" in " ".join(run["stdout"].split())
    # The KV view: what running requests hold and what the tree keeps evictable, both sampled
    server = run["summary"]["server"]
    assert server["kv_used_tokens_peak"] > 0 and server["kv_evictable_tokens_peak"] > 0


def test_replay_under_lru_reproduces_the_cached_tokens(run: dict[str, Any]) -> None:
    # SGLang's radix tree, page size 1, at the run's capacity (sglang:max_total_num_tokens)
    source = load_source(Path(run["dir"]))
    doc = replay_document(source, Path(run["dir"]), plan_of(source, "lru", None, None))
    assert doc["engine_policy"] == "lru" and doc["block_size"] == 1
    assert doc["fidelity"]["weighted_difference"] <= 0.01, doc["fidelity"]
