"""Two real embedded vLLM replicas behind the real sglang-router 0.3.2 (issue 17).

The replicas are the ones test_router.py's tests use too (conftest.py's `replica_pair`, started
as engines.deployment starts a deployment's); the router is started in front of them with the
command engines.deployment would run and waited for until its /workers lists both
(replica_pair.router_in_front), then stopped and checked gone. Calls go through the router with
kvscope's body fields and an x-request-id header, and a system prompt no other test sends (new
to the replicas). The router program: $KVSCOPE_TEST_SGLANG_ROUTER, else
engines.router.executable (pip install 'kvscope[sglang-router]'); skipped without it. About a
minute and a half on 2 CPU cores with the replicas' start.
"""

import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import free_port
from replica_pair import ReplicaPair, router_in_front

from kvscope.config import RouterConfig
from kvscope.config_deployment import ROUTER_POLICIES
from kvscope.engines import router, sglang_router
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import EngineNotInstalled
from kvscope.finalize import replicas
from kvscope.records.run_dir import ROUTER_LOG

pytestmark = pytest.mark.engine
# 266-token prompts: two 128-token blocks; "reviewer": a first block no other test sends
SYSTEM = "You are a careful reviewer. " + "You are a careful analyst. " * 39


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


@pytest.fixture
def executable() -> str:
    """The router program (the test skipped without it, before any replica is started)."""
    return program()


def test_sglang_router_routes_to_vllm_replicas(
    executable: str, replica_pair: ReplicaPair, tmp_path: Path
) -> None:
    port = free_port(2)
    r = RouterConfig(
        kind="sglang-router", policy="round_robin", port=port, metrics_port=port + 1,
        executable=executable,
    )  # fmt: skip
    with router_in_front(replica_pair, r, tmp_path / ROUTER_LOG) as running:
        assert running.process is not None
        base = running.base_url
        listing = httpx.get(base + sglang_router.WORKERS_PATH, timeout=10).json()
        assert listing["total"] == 2  # both registered before start returned
        tagged = [call(base, i % 2, {"x-request-id": "{rid}"}) for i in range(4)]
        untagged = call(base, 0, {})  # the body's request_id alone
        metrics = httpx.get(running.metrics_url, timeout=10).text
        # a second router, policy manual, in front of the same replicas
        mp = free_port(2)
        m = r.model_copy(update={"policy": "manual", "port": mp, "metrics_port": mp + 1})
        with router_in_front(replica_pair, m, tmp_path / "manual.log") as manual:
            key = {"x-request-id": "{rid}", sglang_router.ROUTING_KEY_HEADER: "agent{agent}"}
            keyed = [call(manual.base_url, i % 2, key) for i in range(6)]  # a key per agent
    logs = replica_pair.logs()
    placed = replicas.from_logs(logs, [rid for rid, _ in [*tagged, untagged, *keyed]])
    order = [placed[rid] for rid, _ in tagged]
    assert None not in order  # the header reached vLLM: every tagged call placed by the logs
    assert order[0] != order[1] and order[:2] == order[2:]  # round robin alternates
    # the router rebuilds the body: kvscope's request_id and vLLM's return_token_ids are gone
    assert placed[untagged[0]] is None
    assert all(VllmEngine.reply_prompt_ids(reply) is None for _, reply in tagged)
    cached = [reply["usage"]["prompt_tokens_details"]["cached_tokens"] for _, reply in tagged]
    assert cached[0] == 0 and cached[2] > 0  # new to the replicas, then on agent 0's replica
    served = re.findall(r'^smg_worker_cb_outcomes_total\{worker="[^"]+",outcome="success"\} (\d+)',
                        metrics, re.MULTILINE)  # fmt: skip
    assert sorted(int(n) for n in served) == [2, 3]  # the router's own count per replica
    by_agent = [{placed[rid] for rid, _ in keyed[a::2]} for a in (0, 1)]
    assert all(len(s) == 1 and None not in s for s in by_agent)  # each agent kept its replica
    assert "Router ready" in (tmp_path / ROUTER_LOG).read_text(errors="replace")
    # each router's processes and ports checked gone by router_in_front, the replicas' when the
    # last test using them is done (conftest.py)
