"""Two real embedded vLLM replicas behind the real sglang-router 0.3.2 (issue 17).

The deployment is started by engines.deployment (two replicas, then the router, waited for until
its /workers lists both). Calls go through the router with kvscope's body fields and an
x-request-id header. The router program: $KVSCOPE_TEST_SGLANG_ROUTER, else
engines.router.executable (pip install 'kvscope[sglang-router]'); skipped without it. About a
minute and a half on 2 CPU cores.
"""

import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from helpers import free_port

from kvscope.config import DeploymentConfig, EngineConfig, RouterConfig
from kvscope.config_deployment import ROUTER_POLICIES
from kvscope.engines import deployment, router, sglang_router
from kvscope.engines.process import port_free
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import EngineNotInstalled
from kvscope.finalize import replicas
from kvscope.records.run_dir import ENGINE_LOG, ROUTER_LOG, replica_dir

pytestmark = pytest.mark.engine
SYSTEM = "You are a careful analyst. " * 40  # 266-token prompts: two 128-token blocks


def program() -> str:
    if os.environ.get("KVSCOPE_TEST_SGLANG_ROUTER"):
        return os.environ["KVSCOPE_TEST_SGLANG_ROUTER"]
    try:
        return router.executable(RouterConfig(kind="sglang-router"))
    except EngineNotInstalled:
        pytest.skip("sglang-router is not installed (pip install 'kvscope[sglang-router]')")


def call(base: str, agent: int, headers: dict[str, str]) -> tuple[str, dict[str, Any]]:
    rid = str(uuid.uuid4())
    body: dict[str, Any] = {
        "model": "smollm2", "max_tokens": 4, "temperature": 0,
        "request_id": rid, "session_id": rid, "return_token_ids": True,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": f"Agent {agent}: sum 2 and 3."}],
    }  # fmt: skip
    hdrs = {k: v.format(rid=rid, agent=agent) for k, v in headers.items()}
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, headers=hdrs, timeout=300)
    reply.raise_for_status()
    return rid, reply.json()


def test_the_policies_kvscope_allows_are_the_programs() -> None:
    text = subprocess.run(
        [program(), "launch", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    choices = re.search(r"--policy \{([a-z_,]+)\}", text)
    assert choices is not None, text[:500]
    assert set(choices.group(1).split(",")) == ROUTER_POLICIES["sglang-router"]


def test_sglang_router_routes_to_vllm_replicas(tmp_path: Path) -> None:
    base_port = free_port(20)
    port, kv = base_port, base_port + 10
    engine = EngineConfig(
        port=port, kv_events_port=kv, kv_capacity_tokens=4096, startup_timeout_s=400
    )
    r = RouterConfig(
        kind="sglang-router", policy="round_robin", port=base_port + 18,
        metrics_port=base_port + 19, executable=program(),
    )  # fmt: skip
    dep = DeploymentConfig(replicas=2, router=r, port_stride=5)
    ports = [port, port + 5, kv, kv + 1, kv + 5, kv + 6, r.port, r.metrics_port]
    with deployment.running(dep, engine, tmp_path) as running:
        assert running.router is not None and running.router.process is not None
        base = running.router.base_url
        listing = httpx.get(base + sglang_router.WORKERS_PATH, timeout=10).json()
        assert listing["total"] == 2  # both registered before start returned
        tagged = [call(base, i % 2, {"x-request-id": "{rid}"}) for i in range(4)]
        untagged = call(base, 0, {})  # the body's request_id alone
        metrics = httpx.get(running.router.metrics_url, timeout=10).text
        # a second router, policy manual, in front of the same replicas (ports free now)
        mp = free_port(2)
        m = r.model_copy(update={"policy": "manual", "port": mp, "metrics_port": mp + 1})
        ports += [m.port, m.metrics_port]
        targets = deployment.router_replicas(dep, [h.engine for h in running.replicas.values()])
        manual = router.start(
            m, router.launch(m, targets), tmp_path / "manual.log", [x.base_url for x in targets]
        )
        try:  # one routing key per agent
            key = {"x-request-id": "{rid}", sglang_router.ROUTING_KEY_HEADER: "agent{agent}"}
            keyed = [call(manual.base_url, i % 2, key) for i in range(6)]
        finally:
            manual.stop()
        procs = [*(h.process for h in running.replicas.values()), running.router.process]
        procs.append(manual.process)
        pids = [pid for p in procs if p for pid in (p.pid, *p.descendants())]
    logs = {n: (replica_dir(tmp_path, n) / ENGINE_LOG).read_text() for n in ("r0", "r1")}
    placed = replicas.from_logs(logs, [rid for rid, _ in [*tagged, untagged, *keyed]])
    order = [placed[rid] for rid, _ in tagged]
    assert None not in order  # the header reached vLLM: every tagged call placed by the logs
    assert order[0] != order[1] and order[:2] == order[2:]  # round robin alternates
    # the router rebuilds the body: kvscope's request_id and vLLM's return_token_ids are gone
    assert placed[untagged[0]] is None
    assert all(VllmEngine.reply_prompt_ids(reply) is None for _, reply in tagged)
    assert tagged[2][1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    served = re.findall(r'^smg_worker_cb_outcomes_total\{worker="[^"]+",outcome="success"\} (\d+)',
                        metrics, re.MULTILINE)  # fmt: skip
    assert sorted(int(n) for n in served) == [2, 3]  # the router's own count per replica
    by_agent = [{placed[rid] for rid, _ in keyed[a::2]} for a in (0, 1)]
    assert all(len(s) == 1 and None not in s for s in by_agent)  # each agent kept its replica
    assert "Router ready" in (tmp_path / ROUTER_LOG).read_text(errors="replace")
    assert len(pids) >= 4
    assert [p for p in pids if psutil.pid_exists(p)] == []
    assert [p for p in ports if not port_free("127.0.0.1", p)] == []
