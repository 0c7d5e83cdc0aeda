"""Two real embedded vLLM replicas behind the real vllm-router (issue 17).

`kvscope run` starts a deployment of its own (two replicas, then the router). The other tests
put a router of their own (round robin; kv_aware, subscribed to the replicas' KV events) in
front of the replicas they share with test_sglang_router.py (conftest.py's `replica_pair`):
four calls each, two agents alternating, whose prompts share their first 128-token block, and
the test checks where they went and what the routing cost; the round-robin deployment is then
attached to by `kvscope run`. Each test's prompts start with a system prompt of its own (same
token layout), new to the replicas: no test sees another's blocks, in any order. Every process
is checked gone: a test's router after it, the replicas after the last test using them. The
router program: $KVSCOPE_TEST_ROUTER, else engines.router.executable (pip install
'kvscope[router]'); skipped without it. About a minute per deployment on 2 CPU cores.
"""

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import KVSCOPE, ROOT, free_port
from replica_pair import ReplicaPair, router_in_front

from kvscope.config import RouterConfig
from kvscope.engines import kv_events, router
from kvscope.engines.process import port_free
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import EngineNotInstalled
from kvscope.finalize import replicas
from kvscope.finalize.provenance import build_ledger
from kvscope.finalize.routing_misses import routing_columns
from kvscope.records.kv_events import KV_EVENTS_ARROW
from kvscope.records.run_dir import ENGINE_LOG, ROUTER_LOG, replica_dir, replica_dirs

pytestmark = pytest.mark.engine
BLOCK = 128  # the embedded vLLM's block size


def system(role: str) -> str:
    """266-token prompts: two 128-token blocks, the agent named in the second; `role` (one
    token: analyst, auditor) makes the first block a test's own."""
    return f"You are a careful {role}. " + "You are a careful analyst. " * 39


def program() -> str:
    if os.environ.get("KVSCOPE_TEST_ROUTER"):
        return os.environ["KVSCOPE_TEST_ROUTER"]
    try:
        return router.executable(RouterConfig())
    except EngineNotInstalled:
        pytest.skip("vllm-router is not installed (pip install 'kvscope[router]')")


def call(base: str, engine: VllmEngine, rid: str, agent: int, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "smollm2", "max_tokens": 4, "temperature": 0,
        "request_id": rid, "session_id": rid,
        "messages": [{"role": "system", "content": prompt},
                     {"role": "user", "content": f"Agent {agent}: sum 2 and 3."}],
    }  # fmt: skip
    body |= engine.prompt_ids_fields(body)
    start = time.time_ns()
    reply = httpx.post(
        f"{base}/v1/chat/completions", json=body, headers={"x-request-id": rid}, timeout=300
    )
    reply.raise_for_status()
    data = reply.json()
    usage = data["usage"]
    return {
        "request_uuid": rid, "agent_id": f"agent{agent}", "previous_agent_id": None,
        "workflow_run_id": "w", "status": "ok", "start_ns": start, "end_ns": time.time_ns(),
        "queue_ms": None, "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        "ids": VllmEngine.reply_prompt_ids(data),
    }  # fmt: skip


def placed(base: str, pair: ReplicaPair, role: str) -> list[dict[str, Any]]:
    """Four calls through the router at `base` (a prompt new to the replicas): their rows with
    replica and routing columns."""
    vllm = VllmEngine(pair.engine)
    rows = [call(base, vllm, str(uuid.uuid4()), i % 2, system(role)) for i in range(4)]
    assert rows[0]["cached_tokens"] == 0  # the prompt is new to the replicas
    ids = [x["ids"] for x in rows]  # the shared block, then the agents' own
    assert len({tuple(x[:BLOCK]) for x in ids}) == 1 and ids[0][: 2 * BLOCK] != ids[1][: 2 * BLOCK]
    ledgers = {}
    for name, h in pair.handles.items():
        batches = kv_events.replay(h.endpoints.kv_events_replay or "", 0)
        ledgers[name] = build_ledger((b, e) for b in batches for e in b.events)
    where = replicas.from_logs(pair.logs(), [x["request_uuid"] for x in rows])
    for x in rows:
        x["replica"] = where[x["request_uuid"]]
    tokens = {x["request_uuid"]: x["ids"] for x in rows}
    return routing_columns(rows, tokens, ledgers)


def kvscope_run(cfg: dict[str, Any], tmp_path: Path) -> tuple[str, Path]:
    """`kvscope run` of the config (runs under tmp_path/runs): its output and run directory."""
    cfg["runs_dir"] = str(tmp_path / "runs")
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = subprocess.run(
        [*KVSCOPE, "run", str(path)], capture_output=True, text=True, timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("router-")]
    return result.stdout, run_dir


def check_round_robin(rows: list[dict[str, Any]]) -> None:
    assert all(x["replica"] is not None for x in rows)  # every call placed by the replica logs
    assert rows[0]["replica"] != rows[1]["replica"]  # round robin alternates
    assert [x["replica"] for x in rows[:2]] == [x["replica"] for x in rows[2:]]
    # the second agent's first call recomputed the block the first agent's call left elsewhere
    assert rows[1]["cached_tokens"] == 0
    assert rows[1]["routing_miss_tokens"] == 128
    assert rows[1]["routing_miss_replica"] == rows[0]["replica"]
    assert [x["routing_miss_tokens"] for x in rows[2:]] == [0, 0]  # each back on its replica


def test_kvscope_run_profiles_a_deployment(tmp_path: Path) -> None:
    """`kvscope run` of the shipped router config (round robin), one workflow at a time: the
    calls of one workflow alternate the replicas, so an agent's reuse of another agent's prefix
    lands on the replica that did not compute it."""
    cfg = yaml.safe_load((ROOT / "configs" / "router.yaml").read_text())["base"]
    base_port = free_port(20)
    cfg["engine"] |= {"port": base_port, "kv_events_port": base_port + 10}
    cfg["deployment"]["port_stride"] = 5
    cfg["deployment"]["router"] |= {
        "port": base_port + 18, "metrics_port": base_port + 19, "executable": program(),
    }  # fmt: skip
    cfg["workload"] |= {"workflows": 1, "concurrency": 1, "cycles": 1}
    output, run_dir = kvscope_run(cfg, tmp_path)
    assert "routing (replicas behind the router)" in output
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert {r["replica"] for r in rows} == {"r0", "r1"}  # every call placed, both used
    assert all(r["routing_miss_tokens"] is not None for r in rows)
    missed = [r for r in rows if r["routing_miss_tokens"]]
    assert missed and all(r["routing_miss_replica"] not in (None, r["replica"]) for r in missed)
    assert sorted(replica_dirs(run_dir)) == ["r0", "r1"]
    for folder in replica_dirs(run_dir).values():
        assert (folder / KV_EVENTS_ARROW).exists() and (folder / "metrics.parquet").exists()
    run = json.loads((run_dir / "run.json").read_text())
    assert set(run["launch_commands"]) == {"r0", "r1", "router"}
    router = json.loads((run_dir / "router_metrics.json").read_text())["end"]
    processed = [s for s in router if s["name"] == "vllm_router_processed_requests_total"]
    assert sum(s["value"] for s in processed) == 4  # the router's own count of the calls
    ports = [base_port, base_port + 5, base_port + 10, base_port + 15, base_port + 18]
    assert [p for p in ports if not port_free("127.0.0.1", p)] == []


@pytest.fixture
def executable() -> str:
    """The router program (the test skipped without it, before any replica is started)."""
    return program()


def router_config(policy: str, executable: str) -> RouterConfig:
    port = free_port(2)
    return RouterConfig(policy=policy, port=port, metrics_port=port + 1, executable=executable)


def test_kv_aware_keeps_the_shared_block(
    executable: str, replica_pair: ReplicaPair, tmp_path: Path
) -> None:
    """kv_aware (subscribed to the replicas' KV events): every call on the replica holding the
    prefix."""
    config = router_config("kv_aware", executable)
    with router_in_front(replica_pair, config, tmp_path / ROUTER_LOG) as r:
        rows = placed(r.base_url, replica_pair, "auditor")
    assert len({x["replica"] for x in rows}) == 1  # the replica holding the prefix, every time
    assert rows[1]["cached_tokens"] == 128  # the shared block, served
    assert [x["routing_miss_tokens"] for x in rows] == [0, 0, 0, 0]


def test_round_robin_then_kvscope_run_attaches_to_the_deployment(
    executable: str, replica_pair: ReplicaPair, tmp_path: Path
) -> None:
    """Replicas and router started outside the run, as a user's own deployment is. First four
    calls straight through the router (round robin: the agents split, the second agent misses
    the shared block the first left on the other replica). Then a run attaches (engine kind
    attach, deployment.replica_urls / kv_events_endpoints, router.url). Detection names the
    replicas vLLM, so the calls carry kvscope's request and session ids; with no replica log in
    the run, each call is placed by the session_id of the blocks it stored on its replica's KV
    event stream. The attached processes are left running by the run (stopped, and checked
    gone, when the module is done)."""
    cfg = yaml.safe_load((ROOT / "configs" / "router.yaml").read_text())["base"]
    cfg["workload"] |= {"workflows": 1, "concurrency": 1, "cycles": 1}
    rr = router_config("round_robin", executable)
    with router_in_front(replica_pair, rr, tmp_path / ROUTER_LOG) as running:
        direct = placed(running.base_url, replica_pair, "analyst")
        check_round_robin(direct)
        handles = list(replica_pair.handles.values())
        cfg["engine"] = {"kind": "attach"}
        cfg["deployment"] = {
            "replicas": 2,
            "replica_urls": [h.endpoints.base_url for h in handles],
            "kv_events_endpoints": [h.endpoints.kv_events for h in handles],
            "router": {"policy": "round_robin", "url": running.base_url,
                       "metrics_url": running.metrics_url},
        }  # fmt: skip
        _, run_dir = kvscope_run(cfg, tmp_path)
        for h in [*handles, running]:  # attached: not stopped by the run
            assert h.process is not None and h.process.exit_code() is None
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert all(r["prompt_token_source"] == "engine" for r in rows)  # vLLM's own ids
    assert {r["replica"] for r in rows} == {"r0", "r1"}  # every call placed, by KV events
    missed = [r for r in rows if r["routing_miss_tokens"]]
    assert missed and all(r["routing_miss_replica"] not in (None, r["replica"]) for r in missed)
    assert not (replica_dir(run_dir, "r0") / ENGINE_LOG).exists()  # no log: events placed them
    run = json.loads((run_dir / "run.json").read_text())
    assert run["launch_commands"] == {"r0": None, "r1": None, "router": None}
    assert run["cache_reset"] == "emptied before the workload"  # each replica, as vLLM's
    # each replica's own counters equal the calls placed on it: the placement is right
    checks = json.loads((run_dir / "summary.json").read_text())["reconciliation"]
    assert sorted({c["replica"] for c in checks}) == ["r0", "r1"]
    assert all(c["difference"] == 0 for c in checks), checks
