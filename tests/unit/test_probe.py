"""The profiled client against a stand-in server: recorded vLLM streams and failure modes."""

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from helpers import VLLM_FIXTURES, free_port

from kvscope.config import EngineConfig
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.client import Probe, RunInfo
from kvscope.records.requests import COLUMNS, RequestRecord
from kvscope.workload.runtime import CallIds, LlmCall, PromptInfo

SSE = (VLLM_FIXTURES / "chat_completion_stream.sse").read_text()
IDS = CallIds("bench-1", "t-1", "wf-1", 2, "executor", "planner", "executor")
PROMPT = PromptInfo("v1", "shared-first")
RUN = RunInfo("demo", "abc123", "peer", 2, "smollm2", "chatml")


class Server:
    """Answers POST /v1/chat/completions with `self.reply` and remembers what it received."""

    def __init__(self) -> None:
        self.reply: tuple[int, str, float] = (200, SSE, 0.0)  # status, body, delay before body
        self.received: list[tuple[dict[str, Any], dict[str, str]]] = []

    def serve(self) -> Iterator[str]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.received.append((body, {k.lower(): v for k, v in self.headers.items()}))
                code, text, delay = outer.reply
                time.sleep(delay)
                data = text.encode()
                self.send_response(code)
                ctype = "text/event-stream" if code == 200 else "application/json"
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


@pytest.fixture
def server() -> Iterator[tuple[Server, str]]:
    s = Server()
    gen = s.serve()
    yield s, next(gen)
    gen.close()


def call(base: str, engine: Any = None, timeout_s: float = 10) -> tuple[list, RequestRecord, Any]:
    rows: list[RequestRecord] = []
    engine = engine or VllmEngine(EngineConfig())

    async def go() -> tuple[RequestRecord, str | None]:
        probe = Probe(engine, base, RUN, timeout_s=timeout_s, sink=rows.append)
        try:
            hi = [{"role": "user", "content": "hi"}]
            return await probe.call(LlmCall(hi, IDS, 8, PROMPT, tool_ms=1.5), "req-1")
        finally:
            await probe.close()

    record, content = asyncio.run(go())
    return rows, record, content


def test_recorded_vllm_stream(server: tuple[Server, str]) -> None:
    srv, base = server
    rows, r, content = call(base)
    assert rows == [r]
    assert set(r.to_dict()) == set(COLUMNS)
    usage = next(
        json.loads(line[5:])["usage"]
        for line in SSE.splitlines()
        if line.startswith("data: {") and '"usage":{' in line
    )
    assert r.status == "ok" and r.error_type is None
    assert r.prompt_tokens == usage["prompt_tokens"]
    assert r.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]
    assert r.output_tokens == usage["completion_tokens"]
    assert r.new_prefill_tokens == r.prompt_tokens - r.cached_tokens
    assert r.reported_cache_hit_ratio == pytest.approx(r.cached_tokens / r.prompt_tokens)
    assert content and r.finish_reason in ("stop", "length")
    assert r.sglang_response_id and r.sglang_response_id.startswith("chatcmpl-")
    assert r.ttft_ms is not None and 0 < r.ttft_ms <= r.e2e_ms
    if r.output_tokens > 1:
        assert r.tpot_ms is not None and r.tpot_ms >= 0
    assert r.tool_ms == 1.5
    assert (r.agent_id, r.previous_agent_id, r.turn_id) == ("executor", "planner", 2)
    final = next(
        json.loads(line[5:])
        for line in SSE.splitlines()
        if line.startswith("data: {") and '"usage":{' in line
    )
    # vLLM's own per-request timing (--enable-per-request-metrics), from the usage chunk
    assert r.queue_ms == final["metrics"]["queue_time_ms"]
    assert r.prefill_ms == final["metrics"]["time_to_first_token_ms"]
    assert r.decode_ms == final["metrics"]["generation_time_ms"]
    assert r.cache_used_tokens_before is None  # server context is joined after the run
    body, _ = srv.received[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["request_id"] == "req-1" and body["session_id"] == "req-1"
    assert "extra_key" not in body and "cache_salt" not in body


def test_sglang_tags(server: tuple[Server, str]) -> None:
    srv, base = server
    call(base, SglangEngine(EngineConfig(kind="sglang")))
    body, headers = srv.received[0]
    assert body["rid"] == "req-1" and body["session_id"] == "req-1"
    assert json.loads(headers["x-custom-labels"]) == {"agent": "executor"}


def test_cached_tokens_not_reported(server: tuple[Server, str]) -> None:
    srv, base = server
    srv.reply = (
        200,
        SSE.replace('"prompt_tokens_details":{', '"prompt_tokens_details":null,"x":{'),
        0,
    )
    _, r, _ = call(base)
    assert r.status == "ok"
    assert r.prompt_tokens is not None
    assert (r.cached_tokens, r.new_prefill_tokens, r.reported_cache_hit_ratio) == (None, None, None)


@pytest.mark.parametrize(
    ("reply", "status", "error_type"),
    [
        ((500, '{"error": {"message": "boom"}}', 0), "error", "http_500"),
        ((400, '{"error": {"message": "too long"}}', 0), "error", "http_400"),
        ((200, "data: {not json\n\n", 0), "error", "malformed_stream"),
        ((200, SSE.split('"usage":{')[0].rsplit("data:", 1)[0], 0), "error", "incomplete_stream"),
        ((200, SSE, 3.0), "timeout", "timeout"),
    ],
    ids=["http-500", "http-400", "malformed", "no-usage", "timeout"],
)
def test_failures_are_rows(
    server: tuple[Server, str], reply: tuple, status: str, error_type: str
) -> None:
    srv, base = server
    srv.reply = reply
    rows, r, content = call(base, timeout_s=1.0)
    assert rows == [r]
    assert (r.status, r.error_type) == (status, error_type)
    assert r.error_message
    assert content is None
    assert r.e2e_ms is not None
    assert r.request_uuid == "req-1"


def test_connection_refused_is_a_row() -> None:
    rows, r, _ = call(f"http://127.0.0.1:{free_port()}")
    assert rows == [r]
    assert (r.status, r.error_type) == ("error", "connection")
    assert r.prompt_tokens is None and r.cached_tokens is None
