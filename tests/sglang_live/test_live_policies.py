"""SGLang's radix-tree eviction policies live, in one sweep of configs/policies-sglang.yaml's
spec on a smaller pathology (four agents' ~220-token prompts in a 768-token pool, two PEER
cycles): lru, and priority with kvscope's steps-to-execution eviction hints. Each point is its own
engine (about 40 s to start on 2 AVX2 cores), so the spec's other points are left out to keep the
suite inside its 30 minutes: lfu, slru and plain priority are flags like these two, each checked
against SGLang's own --radix-eviction-policy choices, and the radix cache off against its
--disable-radix-cache (tests/unit/engines/test_sglang_adapter.py)."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import ROOT, Up, free_port
from sglang_session import run_own_engines

pytestmark = pytest.mark.engine
POLICIES = ["lru"]


def test_every_policy_and_radix_off_run_live_and_are_compared(sglang: Up, tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "configs" / "policies-sglang.yaml").read_text())
    base = yaml.safe_load((ROOT / "configs" / spec["base"]).read_text())
    base["engine"] |= {"port": free_port(), "kv_events_port": free_port(2),
                       "context_length": 1024, "kv_capacity_tokens": 768}  # fmt: skip
    base["workload"] |= {"cycles": 2}  # (the capability probe's ~700-token call must fit too)
    base["workload"]["synthetic"] |= {"fixed_tokens": 200, "dynamic_tokens": 16,
                                      "output_tokens": 4}  # fmt: skip
    spec["base"] = base
    spec["matrix"]["engine.eviction_policy"] = POLICIES
    spec["points"] = [p for p in spec["points"] if p.get("eviction_hints")]  # the hinted arm
    runs = run_own_engines(sglang, tmp_path, "sweep", spec)
    (record_path,) = runs.rglob("sweep.json")
    record = json.loads(record_path.read_text())
    points = record["points"]
    assert [p["status"] for p in points] == ["ok"] * 2, points  # lru, priority + hints
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
    by_name = {_arm(p["overrides"]): Path(p["run_dir"]) for p in points}
    hints_reach_the_engine_and_change_the_evictions(by_name["lru"], by_name["hints"])


def _arm(overrides: dict[str, object]) -> str:
    if overrides.get("eviction_hints"):
        return "hints"
    return str(overrides.get("engine.eviction_policy", "off"))


def hints_reach_the_engine_and_change_the_evictions(lru: Path, hinted: Path) -> None:
    """The hinted run's calls carried their priorities (the row keeps what was sent), and the
    engine evicted by them: the first two agents' prefixes stayed (hits in the
    second cycle where LRU recomputed everything), so no Executor -> Expresser eviction is left;
    the replay of the run's own priorities gives exactly the cached tokens it measured."""
    from kvscope.sim.inputs.sources import load_source
    from kvscope.sim.simulate import simulate

    rows = pq.read_table(hinted / "requests.parquet").to_pylist()
    assert all(
        isinstance(r["engine_priority"], int) and r["engine_priority"] % 2 == 0 for r in rows
    )
    logged = "".join(p.read_text() for p in hinted.rglob("*request_log*") if p.is_file())
    assert not logged or '"priority": null' not in logged  # where SGLang logs requests

    def second_cycle(run: Path) -> dict[str, int]:
        table = pq.read_table(run / "requests.parquet").to_pylist()
        return {r["agent_id"]: r["cached_tokens"] for r in table if r["turn_id"] == 2}

    def harm(run: Path) -> set[tuple[str, str]]:
        blocks = pq.read_table(run / "blocks.parquet").to_pylist()
        return {(b["evictor_agent_id"], b["owner_agent_id"]) for b in blocks if b["harmful"]}

    hit, miss = second_cycle(hinted), second_cycle(lru)
    assert hit["planner"] > miss["planner"] + 100 and hit["executor"] > miss["executor"] + 100
    assert ("executor", "expresser") in harm(lru) and ("executor", "expresser") not in harm(hinted)
    source = load_source(hinted)
    assert source.trace.priorities is not None
    capacity = (source.trace.capacity_tokens or 768) // source.trace.block_size
    result = simulate(source.trace, "priority", capacity, engine="sglang")
    replayed = int(result.cached_blocks.sum()) * source.trace.block_size
    assert replayed == sum(r["cached_tokens"] for r in rows)
