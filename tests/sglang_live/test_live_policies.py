"""SGLang's radix-tree eviction policies live, in one sweep (configs/policies-sglang.yaml's
points: lru, lfu, slru, priority, and the radix cache off) on a smaller pathology: four agents'
~220-token prompts in a 768-token pool, two PEER cycles. Each point is its own engine."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import ROOT, Up, free_port
from sglang_session import run_own_engines

pytestmark = pytest.mark.engine
POLICIES = ["lru", "lfu", "slru", "priority"]


def test_every_policy_and_radix_off_run_live_and_are_compared(sglang: Up, tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "configs" / "policies-sglang.yaml").read_text())
    base = yaml.safe_load((ROOT / "configs" / spec["base"]).read_text())
    base["engine"] |= {"port": free_port(), "kv_events_port": free_port(2),
                       "context_length": 1024, "kv_capacity_tokens": 768}  # fmt: skip
    base["workload"] |= {"cycles": 2}  # (the capability probe's ~700-token call must fit too)
    base["workload"]["synthetic"] |= {"fixed_tokens": 200, "dynamic_tokens": 16,
                                      "output_tokens": 4}  # fmt: skip
    spec["base"] = base
    runs = run_own_engines(sglang, tmp_path, "sweep", spec)
    (record_path,) = runs.rglob("sweep.json")
    record = json.loads(record_path.read_text())
    points = record["points"]
    assert [p["status"] for p in points] == ["ok"] * 5, points
    assert record["compare_report"] and Path(record["compare_report"]).exists()
    for point in points:
        run_dir = Path(point["run_dir"])
        launch = (run_dir / "launch_command.txt").read_text()
        rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
        assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
        cached = sum(r["cached_tokens"] for r in rows)
        if point["overrides"].get("engine.prefix_cache") is False:
            assert "--disable-radix-cache" in launch and cached == 0
        else:
            policy = point["overrides"]["engine.eviction_policy"]
            assert f"--radix-eviction-policy {policy}" in launch
            assert cached > 0  # the chat template's start at least; more where a prefix stayed
            summary = json.loads((run_dir / "summary.json").read_text())
            recon = {r["counter"]: r for r in summary["reconciliation"]}
            assert recon["cached_tokens_total"]["difference"] == 0, (policy, recon)
    assert {p["overrides"].get("engine.eviction_policy") for p in points} >= set(POLICIES)
