"""The real embedded engine (vLLM CPU + SmolLM2), started once per session by `engine up`."""

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import CAPACITY, Up

from kvscope.engines.detect import fetch_metrics
from kvscope.engines.kv_events import receive, replay, subscriber
from kvscope.engines.vllm import VllmEngine

pytestmark = pytest.mark.engine
SHARED = "\n".join(f"Shared rule {i}: entry {i * 13 % 41} must balance." for i in range(90))


def chat(base: str, system: str, question: str, **extra: Any) -> dict[str, Any]:
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 8,
        "temperature": 0,
        **extra,
    }
    resp = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
    resp.raise_for_status()
    return resp.json()["usage"]


def test_status_shows_model_capacity_and_capabilities(up: Up) -> None:
    result = up.cli("engine", "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["healthy"] is True
    caps = status["capabilities"]
    assert caps["models"] == ["smollm2"]
    assert caps["capacity_tokens"] == CAPACITY
    assert caps["cached_tokens"] is True
    assert caps["metrics"] is True
    assert caps["kv_events"] is True
    assert caps["family"] == "vllm"
    env = json.loads((up.state_dir / "environment.json").read_text())
    assert env["engine"]["version"] == "0.32.0"
    assert "--enable-prefix-caching" in env["engine"]["argv"]
    model = env["model"]
    assert model["model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert model["chat_template_sha256"] and model["tokenizer_sha256"]
    assert model["kv_cache_dtype"] == "auto" and model["dtype"] == "bfloat16"
    assert model["context_length"] == 2048


def test_dtype_follows_the_cpu_and_is_shown(up: Up) -> None:
    env = json.loads((up.state_dir / "environment.json").read_text())
    choice = env["engine"]["dtype"]
    native = set(env["cpu"]["isa_flags"]) & {"avx512_bf16", "amx_bf16"}
    if not env["cpu"]["isa_caps"]:  # (caps: tests/unit/engines/test_cpu.py)
        assert choice["dtype"] == ("bfloat16" if native else "float32")
    argv = env["engine"]["argv"]
    assert argv[argv.index("--dtype") + 1] == choice["dtype"]
    assert choice["reason"].startswith("auto: ")
    # the engine itself says it runs in that dtype
    assert f"dtype=torch.{choice['dtype']}" in Path(up.state["log_path"]).read_text()
    shown = up.cli("engine", "status").stdout
    assert re.search(rf"dtype\s+{choice['dtype']} \(auto: ", shown), shown


def test_shared_system_prompt_is_reused_and_counted(up: Up) -> None:
    system = f"[{uuid.uuid4()}]\n{SHARED}"  # fresh head: the first call is cold
    metrics_url = up.state["endpoints"]["metrics_url"]
    with httpx.Client() as client:
        before = VllmEngine.counters(fetch_metrics(client, metrics_url) or [])
        first = chat(up.base, system, "Which entry is largest?")
        second = chat(up.base, system, "Name one rule.")
        after = VllmEngine.counters(fetch_metrics(client, metrics_url) or [])
    assert first["prompt_tokens"] > 1000
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert cached % 128 == 0  # vLLM reuses whole blocks
    assert second["prompt_tokens"] - cached < 128 + 20  # all of the shared prefix's full blocks
    # The engine's own counters moved by exactly what the two responses reported.
    delta = {k: after[k] - before[k] for k in ("prompt_tokens_total", "cached_tokens_total")}
    assert delta["cached_tokens_total"] == cached
    assert delta["prompt_tokens_total"] == first["prompt_tokens"] + second["prompt_tokens"]


def test_kv_events_arrive_on_the_zmq_socket(up: Up) -> None:
    ep = up.state["endpoints"]
    started = time.time()
    with subscriber(ep["kv_events"], ep["kv_events_subscriber_binds"]) as sock:
        time.sleep(0.5)
        # A publisher may drop its first batch after a subscriber joins; the second one is live.
        chat(up.base, f"[{uuid.uuid4()}] {SHARED}", "Hi.", session_id="warmup")
        usage = chat(up.base, f"[{uuid.uuid4()}] {SHARED}", "Hi.", session_id="planner")
        live = receive(sock, 5.0)
    stored = [e for b in live for e in b.events if e.kind == "stored"]
    mine = [e for e in stored if e.session_id == "planner"]
    assert mine, f"no live BlockStored for the planner request; got {stored}"
    blocks = sum(len(e.block_hashes) for e in mine)
    assert all(e.block_size == 128 for e in mine)
    assert sum(len(e.token_ids) for e in mine) == blocks * 128
    assert blocks == usage["prompt_tokens"] // 128  # every full block of the prompt was stored
    # Everything published is also in the replay buffer, with gap-free sequence numbers.
    batches = replay(ep["kv_events_replay"])
    seqs = [b.seq for b in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    recent = [e for b in batches if b.ts_ns >= (started - 1) * 1e9 for e in b.events]
    assert any(e.session_id == "warmup" for e in recent)


def test_engine_check_command(up: Up) -> None:
    result = up.cli("engine", "check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cached tokens" in result.stdout
    assert "BlockStored" in result.stdout
