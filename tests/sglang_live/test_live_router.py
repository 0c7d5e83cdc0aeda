"""Two SGLang replicas behind the real sglang-router (configs/router-sglang.yaml, round_robin):
the router drops kvscope's rid and session_id, yet every call is placed on its replica (by the
x-request-id header each replica logs), each replica's counters reconcile with the calls placed
on it, and the routing misses are counted per agent. Skipped where sglang-router is missing."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from helpers import ROOT, Up, free_port
from sglang_session import run_own_engines

from kvscope.config import RouterConfig
from kvscope.engines import router
from kvscope.errors import EngineNotInstalled

pytestmark = pytest.mark.engine


def test_every_call_placed_and_routing_misses_per_agent(sglang: Up, tmp_path: Path) -> None:
    try:
        router.executable(RouterConfig(kind="sglang-router"))
    except EngineNotInstalled:
        pytest.skip("sglang-router is not installed (pip install 'kvscope[sglang-router]')")
    spec = yaml.safe_load((ROOT / "configs" / "router-sglang.yaml").read_text())
    cfg = spec["base"]
    cfg["engine"] |= {"port": free_port(20), "kv_events_port": free_port(20)}
    cfg["deployment"]["router"] |= {"port": free_port(), "metrics_port": free_port()}
    # One call at a time: round_robin then alternates the replicas call by call, so each agent
    # lands on the replica that did not compute the shared task prefix its predecessor just
    # did. (Two workflows in lockstep could each keep to one replica and miss nothing.)
    cfg["workload"] |= {"workflows": 1, "concurrency": 1, "max_tokens": 4}
    (run_dir,) = run_own_engines(sglang, tmp_path, "run", cfg).glob("router-sglang-*")
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    assert {r["replica"] for r in rows} == {"r0", "r1"}  # every call placed, both replicas used
    assert all(r["prefill_ms"] is not None for r in rows)  # each replica's export, joined
    summary = json.loads((run_dir / "summary.json").read_text())
    routing = summary["routing"]
    assert routing["unplaced_calls"] == 0
    by_agent = {x["group"]: x for x in routing["by_agent"]}
    assert set(by_agent) == {"planner", "executor", "expresser", "reviewer"}
    assert all(x["routing_miss_tokens"] is not None for x in by_agent.values())
    assert sum(x["routing_miss_tokens"] for x in by_agent.values()) > 0  # round_robin misses
    for check in summary["reconciliation"]:  # per replica: its counters vs its calls
        assert check["replica"] in ("r0", "r1") and check["difference"] == 0, check
