"""Calls to the engine's OpenAI Responses API (/v1/responses, the OpenAI Agents SDK's default
model) are rows like chat calls: against a stand-in vLLM that answers with vLLM 0.32.0's recorded
/v1/responses replies (tests/fixtures/vllm-0.32.0/responses*), streamed and not, failing, cut
off; the app reads the engine's bytes unchanged."""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import pytest
from helpers import VLLM_FIXTURES

from kvscope.config import EngineConfig
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.intercept import Interceptor
from kvscope.probe.wire import CallContext
from kvscope.records.requests import COLUMNS, RequestRecord

BASE = "http://engine:8000"
REPLY = json.loads((VLLM_FIXTURES / "responses.json").read_text())
TOOL_REPLY = json.loads((VLLM_FIXTURES / "responses_tool_call.json").read_text())
ERROR = json.loads((VLLM_FIXTURES / "responses_error.json").read_text())
EVENTS = [e + "\n\n" for e in (VLLM_FIXTURES / "responses_stream.sse").read_text().split("\n\n")]
EVENTS = [e for e in EVENTS if e.strip()]
COMPLETED = json.loads(EVENTS[-1].split("data: ", 1)[1])["response"]
REPLY_ID = json.loads(EVENTS[0].split("data: ", 1)[1])["response"]["id"]
ASK = {"model": "smollm2", "input": "Why is the sky blue?", "instructions": "Be brief."}


@dataclass
class Engine:
    """vLLM's /v1/responses as recorded; its response id is the body's `request_id` when one
    is sent (vLLM 0.32.0: `id=request.request_id`), as it is for every row kvscope tags."""

    reply: dict[str, Any] = field(default_factory=lambda: REPLY)
    script: list[dict[str, Any]] = field(default_factory=list)  # whole replies first, in turn
    events: list[str] = field(default_factory=lambda: list(EVENTS))
    status: int = 200
    cut_after: int | None = None  # the stream breaks after this many events
    delay_s: float = 0.0
    received: list[dict[str, Any]] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)  # every byte the engine answered

    def transport(self, asynchronous: bool = False) -> httpx2.BaseTransport:
        def handle(request: httpx2.Request) -> httpx2.Response:
            body = json.loads(request.content)
            self.received.append(body)
            rid = body.get("request_id")
            if self.status >= 400:
                return self._whole(self.status, json.dumps(ERROR).encode())
            if not body.get("stream"):
                reply = (self.script.pop(0) if self.script else self.reply) | (
                    {"id": rid} if rid else {}
                )
                return self._whole(200, json.dumps(reply).encode())
            events = [e.replace(REPLY_ID, rid) if rid else e for e in self.events]
            stream = self._async(events) if asynchronous else self._sync(events)
            headers = {"content-type": "text/event-stream; charset=utf-8"}
            return httpx2.Response(200, headers=headers, stream=stream)

        return httpx2.MockTransport(handle)

    def _whole(self, status: int, content: bytes) -> httpx2.Response:
        self.sent.append(content)
        return httpx2.Response(
            status, headers={"content-type": "application/json"}, content=content
        )

    def _sync(self, events: list[str]) -> httpx2.SyncByteStream:
        engine = self

        class Events(httpx2.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for i, event in enumerate(events):
                    if engine.cut_after is not None and i == engine.cut_after:
                        raise httpx2.RemoteProtocolError("peer closed connection")
                    time.sleep(engine.delay_s)
                    engine.sent.append(event.encode())
                    yield event.encode()

        return Events()

    def _async(self, events: list[str]) -> httpx2.AsyncByteStream:
        engine = self

        class Events(httpx2.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                for event in events:
                    await asyncio.sleep(engine.delay_s)
                    engine.sent.append(event.encode())
                    yield event.encode()

        return Events()


class Rows(list[RequestRecord]):
    def intercepting(self) -> Interceptor:
        ctx = CallContext(
            "bench-1", "exp", "hash", "openai-agents", 1, "smollm2", None, self.append
        )
        return Interceptor(VllmEngine(EngineConfig()), BASE, ctx)


@pytest.fixture
def rows() -> Rows:
    return Rows()


def sdk(engine: Engine, asynchronous: bool = False) -> Any:
    if asynchronous:
        http = httpx2.AsyncClient(transport=engine.transport(asynchronous=True))
        return openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http)
    http = httpx2.Client(transport=engine.transport())
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http, max_retries=0)


def usage_of(response: dict[str, Any]) -> tuple[int, int, int, int]:
    u = response["usage"]
    return (u["input_tokens"], u["output_tokens"], u["input_tokens_details"]["cached_tokens"],
            u["output_tokens_details"]["reasoning_tokens"])  # fmt: skip


def counts(r: RequestRecord) -> tuple[Any, ...]:
    return (r.prompt_tokens, r.output_tokens, r.cached_tokens, r.reasoning_tokens)


def test_a_streamed_call_is_one_row_and_the_app_reads_the_engines_bytes(rows: Rows) -> None:
    engine = Engine(delay_s=0.005)
    with rows.intercepting():
        stream = sdk(engine).responses.create(**ASK, stream=True)
        events = [e.type for e in stream]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    [r] = rows
    assert set(r.to_dict()) == set(COLUMNS)
    assert (r.status, r.error_type) == ("ok", None)
    assert counts(r) == usage_of(COMPLETED) and r.cached_tokens > 0  # recorded: 512 of 528
    assert r.new_prefill_tokens == r.prompt_tokens - r.cached_tokens
    assert r.finish_reason == "length"  # status incomplete: max_output_tokens
    assert r.ttft_ms is not None and r.ttft_ms >= 5 * events.index("response.output_text.delta")
    assert r.tpot_ms is not None and r.ttft_ms < r.e2e_ms
    assert r.prefill_ms == COMPLETED["metrics"]["time_to_first_token_ms"]
    assert r.sglang_response_id == r.request_uuid  # vLLM: the response id is the request_id
    [body] = engine.received
    assert body == {**ASK, "stream": True, "request_id": r.request_uuid,
                    "session_id": r.request_uuid}  # fmt: skip
    # no stream_options (usage always comes), no return_token_ids (not served here)
    assert r.prompt_token_source is None and r.token_id_hash is None  # prompt not rendered


def test_raw_bytes_streamed_and_not_are_the_engines(rows: Rows) -> None:
    for stream in (True, False):
        engine = Engine()
        http = httpx2.Client(transport=engine.transport())
        with rows.intercepting():
            read = http.post(f"{BASE}/v1/responses", json={**ASK, "stream": stream}).content
        assert read == b"".join(engine.sent) and read
    assert [r.status for r in rows] == ["ok", "ok"]
    assert [r.ttft_ms is None for r in rows] == [False, True]


def test_a_whole_reply_has_its_usage_and_text_but_no_ttft(rows: Rows) -> None:
    engine = Engine()
    plain = sdk(engine).responses.create(**ASK)
    with rows.intercepting():
        seen = sdk(engine).responses.create(**ASK)
    assert seen.output_text == plain.output_text == REPLY["output"][0]["content"][0]["text"]
    [r] = rows
    assert (r.status, r.finish_reason) == ("ok", "length")
    assert counts(r) == usage_of(REPLY)
    assert r.ttft_ms is None and r.tpot_ms is None and r.e2e_ms is not None
    assert r.queue_ms == REPLY["metrics"]["queue_time_ms"]
    assert r.sglang_response_id == r.request_uuid != plain.id


def test_async_streamed_call(rows: Rows) -> None:
    async def run() -> list[str]:
        stream = await sdk(Engine(), asynchronous=True).responses.create(**ASK, stream=True)
        return [e.type async for e in stream]

    with rows.intercepting():
        events = asyncio.run(run())
    assert events[-1] == "response.completed"
    [r] = rows
    assert r.status == "ok" and counts(r) == usage_of(COMPLETED) and r.ttft_ms is not None


CALLED = {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (REPLY | {"status": "completed", "incomplete_details": None}, "stop"),
        (REPLY | {"status": "completed", "output": [CALLED]}, "tool_calls"),
        (REPLY | {"incomplete_details": {"reason": "content_filter"}}, "content_filter"),
        (REPLY | {"status": "cancelled", "incomplete_details": None}, "cancelled"),
    ],
    ids=["completed", "function-call", "filtered", "cancelled"],
)
def test_finish_reason_from_the_status(rows: Rows, reply: dict[str, Any], reason: str) -> None:
    with rows.intercepting():
        sdk(Engine(reply=reply)).responses.create(**ASK)
    assert [(r.status, r.finish_reason) for r in rows] == [("ok", reason)]


def test_the_recorded_tool_call_text_counts(rows: Rows) -> None:
    """vLLM 0.32.0 answered a named tool_choice on /v1/responses with a message (not enforced)."""
    with rows.intercepting():
        sdk(Engine(reply=TOOL_REPLY)).responses.create(**ASK)
    assert [counts(r) for r in rows] == [usage_of(TOOL_REPLY)]


def test_an_http_error_is_a_row_and_the_app_gets_the_same_error(rows: Rows) -> None:
    engine = Engine(status=404)
    with rows.intercepting(), pytest.raises(openai.NotFoundError) as raised:
        sdk(engine).responses.create(**ASK)
    assert "does not exist" in str(raised.value)
    [r] = rows
    assert (r.status, r.error_type) == ("error", "http_404")
    assert r.error_message == ERROR["error"]["message"]
    assert r.prompt_tokens is None and r.output_tokens is None  # not measured: null


ERROR_EVENT = {"type": "error", "code": "server_error", "message": "engine died", "param": None}
VLLM_ERROR = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
FAILED = COMPLETED | {"status": "failed", "usage": None, "error": {"code": "x", "message": "oom"}}


@pytest.mark.parametrize(
    ("last", "error_type", "message"),
    [
        (ERROR_EVENT, "response_failed", "engine died"),
        (VLLM_ERROR, "http_500", "boom"),
        ({"type": "response.failed", "response": FAILED}, "response_failed", "oom"),
    ],
    ids=["error-event", "vllm-error-data", "response-failed"],
)
def test_an_error_in_the_stream_is_a_row_with_its_error(
    rows: Rows, last: dict[str, Any], error_type: str, message: str
) -> None:
    events = [*EVENTS[:5], f"event: {last.get('type', 'error')}\ndata: {json.dumps(last)}\n\n"]
    engine = Engine(events=events)
    http = httpx2.Client(transport=engine.transport())
    with rows.intercepting():
        read = http.post(f"{BASE}/v1/responses", json={**ASK, "stream": True}).content
    assert read == b"".join(engine.sent)
    [r] = rows
    assert (r.status, r.error_type, r.error_message) == ("error", error_type, message)


def test_a_stream_cut_before_its_end(rows: Rows) -> None:
    engine = Engine(cut_after=6)
    with rows.intercepting(), pytest.raises(openai.APIConnectionError):
        list(sdk(engine).responses.create(**ASK, stream=True))
    [r] = rows
    assert (r.status, r.error_type) == ("error", "connection")
    assert r.prompt_tokens is None


def test_a_stream_ending_without_its_completed_event_is_incomplete(rows: Rows) -> None:
    http = httpx2.Client(transport=Engine(events=EVENTS[:-1]).transport())
    with rows.intercepting():
        http.post(f"{BASE}/v1/responses", json={**ASK, "stream": True})
    assert [(r.status, r.error_type) for r in rows] == [("error", "incomplete_stream")]


def test_responses_elsewhere_pass_untouched_and_nothing_is_warned(
    rows: Rows, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine()
    http = httpx2.Client(transport=engine.transport())
    with rows.intercepting(), caplog.at_level("WARNING", logger="kvscope"):
        http.post("http://elsewhere:8000/v1/responses", json=ASK)
        http.post(f"{BASE}/v1/responses/resp_1/cancel", json={})
        http.post(f"{BASE}/v1/responses", json=ASK)
    assert engine.received[:2] == [ASK, {}]  # untouched: no tags
    assert len(rows) == 1 and engine.received[2]["request_id"] == rows[0].request_uuid
    assert caplog.records == []


def test_the_agents_sdks_default_model_calls_are_rows_named_by_agent(rows: Rows) -> None:
    """OpenAIResponsesModel (the SDK's default): triage hands off to billing, two rows."""
    agents = pytest.importorskip("agents")
    agents.set_trace_processors([])  # nothing exported
    hand_off = CALLED | {"name": "transfer_to_billing", "id": "fc_1", "status": "completed"}
    done = REPLY | {"status": "completed", "incomplete_details": None}
    engine = Engine(reply=done, script=[done | {"output": [hand_off]}])
    http = httpx2.AsyncClient(transport=engine.transport(asynchronous=True))
    client = openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http)
    model = agents.OpenAIResponsesModel(model="smollm2", openai_client=client)
    billing = agents.Agent(name="billing", instructions="Billing.", model=model)
    triage = agents.Agent(name="triage", instructions="Route.", model=model, handoffs=[billing])
    with rows.intercepting():
        result = agents.Runner.run_sync(triage, "Why was I charged twice?")
    assert result.last_agent.name == "billing"
    assert [(r.agent_id, r.previous_agent_id, r.status) for r in rows] == [
        ("triage", None, "ok"),
        ("billing", "triage", "ok"),
    ]
    assert rows[0].finish_reason == "tool_calls" and rows[0].workflow_run_id is not None
    assert [b["request_id"] for b in engine.received] == [r.request_uuid for r in rows]


def test_sglang_gets_its_rid_as_request_id(rows: Rows) -> None:
    """SGLang 0.5.23's /v1/responses ignores `rid`: its rid is the body's `request_id`."""
    engine = Engine()
    http = httpx2.Client(transport=engine.transport())
    ctx = CallContext("b", "e", "h", "openai-agents", 1, "m", None, rows.append)
    with Interceptor(SglangEngine(EngineConfig(kind="sglang")), BASE, ctx):
        http.post(f"{BASE}/v1/responses", json=ASK)
    [r] = rows
    [body] = engine.received
    assert "rid" not in body and body["request_id"] == body["session_id"] == r.request_uuid
    assert r.sglang_response_id == r.request_uuid
