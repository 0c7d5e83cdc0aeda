"""What an engine can answer badly, over real HTTP (a stand-in server on a local port): every
call is one row with a status and an error type, what was not measured is null, and the app
gets the SDK's own error. Cases: an over-long prompt refused with 400 (vLLM's error body), a
stall longer than the client's timeout, a stream cut off mid-event, a stream without usage."""

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from helpers import free_port
from vllm_stub import EVENTS, USAGE_EVENT

from kvscope.config import EngineConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.intercept import Interceptor
from kvscope.probe.wire import CallContext
from kvscope.records.requests import RequestRecord

TOO_LONG = {"error": {"message": "This model's maximum context length is 2048 tokens. However, "
                      "your request has 3100 input tokens.", "type": "BadRequestError",
                      "param": None, "code": 400}}  # fmt: skip
Reply = Callable[[BaseHTTPRequestHandler], None]


def too_long(h: BaseHTTPRequestHandler) -> None:
    body = json.dumps(TOO_LONG).encode()
    h.send_response(400)
    h.send_header("content-type", "application/json")
    h.send_header("content-length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def stall(h: BaseHTTPRequestHandler) -> None:
    time.sleep(3)  # longer than the client's timeout


def sse(events: list[str], close_early: bool = False) -> Reply:
    def reply(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.end_headers()
        for event in events:
            h.wfile.write(event.encode())
            h.wfile.flush()
        if close_early:
            h.wfile.write(b'data: {"id":"x","choices":[{"delta":{"content":"hal')  # cut mid-event
            h.wfile.flush()
            h.close_connection = True

    return reply


class StandIn:
    """A local HTTP engine whose answer to every POST is `reply`."""

    def __init__(self) -> None:
        self.reply: Reply = lambda h: None
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                stand_in.reply(self)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def call(self, reply: Reply, **kw: object) -> tuple[RequestRecord, BaseException | None]:
        """One streamed chat call through kvscope's interception: (its row, the app's error)."""
        self.reply = reply
        rows: list[RequestRecord] = []
        ctx = CallContext("bench-1", "exp", "hash", "langgraph", 1, "smollm2", None, rows.append)
        client = openai.OpenAI(base_url=f"{self.base}/v1", api_key="x", max_retries=0, timeout=0.5)
        error = None
        with Interceptor(VllmEngine(EngineConfig()), self.base, ctx):
            try:
                stream = client.chat.completions.create(
                    model="smollm2", messages=[{"role": "user", "content": "hi"}], stream=True, **kw
                )
                list(stream)
            except Exception as err:  # the app's own error, as the SDK raises it
                error = err
        [row] = rows
        return row, error


@pytest.fixture
def engine() -> Iterator[StandIn]:
    stand_in = StandIn()
    yield stand_in
    stand_in.server.shutdown()


def test_an_over_long_prompt_refused_with_400(engine: StandIn) -> None:
    row, error = engine.call(too_long)
    assert isinstance(error, openai.BadRequestError)
    assert (row.status, row.error_type) == ("error", "http_400")
    assert "maximum context length" in (row.error_message or "")
    assert row.prompt_tokens is None and row.cached_tokens is None and row.ttft_ms is None


def test_a_stall_longer_than_the_timeout(engine: StandIn) -> None:
    t0 = time.monotonic()
    row, error = engine.call(stall)
    assert isinstance(error, openai.APITimeoutError) and time.monotonic() - t0 < 2.5
    assert (row.status, row.error_type) == ("timeout", "timeout")
    assert row.e2e_ms is not None and row.prompt_tokens is None


def test_a_stream_cut_off_mid_event(engine: StandIn) -> None:
    content = [e for e in EVENTS if e != USAGE_EVENT and "[DONE]" not in e][:3]
    row, _ = engine.call(sse(content, close_early=True))
    # (the SDK drops an unterminated last event without a word: the row says what happened)
    assert (row.status, row.error_type) == ("error", "malformed_stream")
    assert "Unterminated" in (row.error_message or "")
    assert row.prompt_tokens is None and row.output_tokens is None


def test_a_stream_without_usage_is_ok_with_unknown_counts(engine: StandIn) -> None:
    """An engine that never sends the usage chunk kvscope asked for: the call succeeded, its
    token counts are unknown (null), its timings are measured."""
    row, error = engine.call(sse([e for e in EVENTS if e != USAGE_EVENT]))
    assert error is None
    assert row.status == "ok" and row.ttft_ms is not None
    assert (row.prompt_tokens, row.output_tokens, row.cached_tokens) == (None, None, None)
    assert row.tpot_ms is None  # over output tokens: unknown without usage
