"""Interception of an unmodified app's calls: the OpenAI SDK (sync / async, streamed or not) and
ChatOpenAI against a stand-in vLLM (recorded replies), each call one row, the app's view intact."""

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
from langchain_openai import ChatOpenAI
from vllm_stub import CONTENT, REPLY, USAGE, USAGE_EVENT, Stub

from kvscope.config import EngineConfig
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.intercept import Interceptor
from kvscope.probe.wire import CallContext
from kvscope.records.requests import COLUMNS, RequestRecord

BASE = "http://engine:8000"
HI = [{"role": "user", "content": "hi"}]


class Rows(list[RequestRecord]):
    def ctx(self) -> CallContext:
        return CallContext("bench-1", "exp", "hash", "langgraph", 1, "smollm2", None, self.append)


@pytest.fixture
def rows() -> Rows:
    return Rows()


def intercepting(rows: Rows, engine: Any = None) -> Interceptor:
    return Interceptor(engine or VllmEngine(EngineConfig()), BASE, rows.ctx())


def sdk(stub: Stub, asynchronous: bool = False) -> Any:
    if asynchronous:
        http = httpx2.AsyncClient(transport=stub.transport(httpx2, asynchronous=True))
        return openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http)
    http = httpx2.Client(transport=stub.transport(httpx2))
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http, max_retries=0)


def chat_stream(client: Any, **kw: Any) -> list[dict[str, Any]]:
    stream = client.chat.completions.create(model="smollm2", messages=HI, stream=True, **kw)
    return [chunk.model_dump() for chunk in stream]


def test_streamed_sdk_call_is_one_row_and_the_app_sees_the_same_stream(rows: Rows) -> None:
    stub = Stub(delay_s=0.01)
    plain = chat_stream(sdk(stub))
    with intercepting(rows):
        seen = chat_stream(sdk(stub), extra_body={"top_k": 3})
    assert seen == plain  # the usage chunk kvscope asked for is not in the app's stream
    assert all(chunk["usage"] is None for chunk in seen)
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in seen if c["choices"]) == (
        CONTENT
    )
    [r] = rows
    assert set(r.to_dict()) == set(COLUMNS)
    assert (r.status, r.error_type, r.finish_reason) == ("ok", None, "length")
    assert r.prompt_tokens == USAGE["usage"]["prompt_tokens"]
    assert r.cached_tokens == USAGE["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert r.output_tokens == USAGE["usage"]["completion_tokens"]
    assert r.new_prefill_tokens == r.prompt_tokens - r.cached_tokens
    assert r.ttft_ms is not None and r.ttft_ms >= 10  # the first content token came 2 events in
    assert r.tpot_ms is not None and r.tpot_ms >= 5
    assert r.ttft_ms < r.e2e_ms
    assert r.queue_ms == USAGE["metrics"]["queue_time_ms"]
    assert r.prefill_ms == USAGE["metrics"]["time_to_first_token_ms"]
    assert r.decode_ms == USAGE["metrics"]["generation_time_ms"]
    assert r.agent_id is None and r.workflow_run_id is None  # outside any graph: still a row
    _, body, headers = stub.received[-1]
    assert body["request_id"] == r.request_uuid == body["session_id"]
    assert headers["x-request-id"] == r.request_uuid  # what a router forwards
    assert body["stream_options"] == {"include_usage": True}
    assert body["top_k"] == 3 and body["messages"] == HI  # the app's own fields kept


def test_an_app_that_asks_for_usage_gets_the_engine_bytes_unchanged(rows: Rows) -> None:
    stub = Stub()
    payload = {"model": "m", "messages": HI, "stream": True}
    payload["stream_options"] = {"include_usage": True}
    url = f"{BASE}/v1/chat/completions"
    with httpx2.Client(transport=stub.transport(httpx2)) as client:
        plain = client.post(url, json=payload).content
        with intercepting(rows):
            seen = client.post(url, json=payload).content
    assert seen == plain and USAGE_EVENT.encode() in seen
    assert rows[0].cached_tokens == USAGE["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_raw_bytes_without_usage_request_are_the_engine_bytes_minus_the_usage_event(
    rows: Rows,
) -> None:
    stub = Stub()
    payload = {"model": "m", "messages": HI, "stream": True}
    url = f"{BASE}/v1/chat/completions"
    with httpx.Client(transport=stub.transport(httpx)) as client:  # classic httpx too
        plain = client.post(url, json=payload).content
        with intercepting(rows):
            seen = client.post(url, json=payload).content
    assert seen == plain and b'"usage":{' not in seen
    assert rows[0].prompt_tokens == USAGE["usage"]["prompt_tokens"]


def test_non_streamed_call_has_e2e_and_engine_timings_but_no_ttft(rows: Rows) -> None:
    stub = Stub()
    plain = sdk(stub).chat.completions.create(model="smollm2", messages=HI).model_dump()
    with intercepting(rows):
        seen = sdk(stub).chat.completions.create(model="smollm2", messages=HI).model_dump()
    assert seen == plain
    [r] = rows
    assert r.status == "ok" and r.e2e_ms is not None and r.e2e_ms > 0
    assert (r.ttft_ms, r.tpot_ms) == (None, None)
    assert r.prompt_tokens == REPLY["usage"]["prompt_tokens"]
    assert r.prefill_ms == REPLY["metrics"]["time_to_first_token_ms"]
    assert "stream_options" not in stub.received[-1][1]


@pytest.mark.parametrize("stream", [False, True])
def test_async_sdk_calls(rows: Rows, stream: bool) -> None:
    stub = Stub(delay_s=0.005)

    async def go() -> Any:
        client = sdk(stub, asynchronous=True)
        reply = await client.chat.completions.create(model="smollm2", messages=HI, stream=stream)
        if not stream:
            return reply.choices[0].message.content
        return "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])

    plain = asyncio.run(go())
    with intercepting(rows):
        seen = asyncio.run(go())
    assert seen == plain == CONTENT
    [r] = rows
    assert r.status == "ok" and r.prompt_tokens == USAGE["usage"]["prompt_tokens"]
    assert (r.ttft_ms is not None) is stream


def test_a_streamed_async_call_leaves_the_loop_no_stream_to_finalize(
    rows: Rows, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenAI SDK stops reading at [DONE] and closes the response: the intercepted reply
    closes the stream it reads (as httpx's streams do), so the event loop finalizes no more
    async generators a call than without kvscope (each one a self-pipe write and a loop turn)."""
    finalized: list[str] = []
    hook = asyncio.BaseEventLoop._asyncgen_finalizer_hook

    def counted(loop: Any, agen: Any) -> None:
        finalized.append(agen.__qualname__)
        hook(loop, agen)

    monkeypatch.setattr(asyncio.BaseEventLoop, "_asyncgen_finalizer_hook", counted)

    async def go(n: int) -> None:
        client = sdk(Stub(), asynchronous=True)
        for _ in range(n):
            reply = await client.chat.completions.create(model="smollm2", messages=HI, stream=True)
            assert "".join([c.choices[0].delta.content or "" async for c in reply]) == CONTENT

    asyncio.run(go(5))
    plain, finalized[:] = list(finalized), []
    with intercepting(rows):
        asyncio.run(go(5))
    assert len(rows) == 5 and {r.status for r in rows} == {"ok"}
    assert sorted(finalized) == sorted(plain)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_endpoint(rows: Rows, stream: bool) -> None:
    stub = Stub()
    with intercepting(rows):
        reply = sdk(stub).completions.create(model="smollm2", prompt="hi", stream=stream)
        text = "".join(c.choices[0].text for c in reply if c.choices) if stream else None
    assert text in (None, CONTENT)
    [r] = rows
    assert r.status == "ok" and r.output_tokens == USAGE["usage"]["completion_tokens"]
    assert stub.received[-1][0] == f"{BASE}/v1/completions"


def test_chat_openai_invoke_and_stream(rows: Rows) -> None:
    stub = Stub()

    def llm() -> ChatOpenAI:
        http = httpx2.Client(transport=stub.transport(httpx2))
        return ChatOpenAI(model="smollm2", base_url=f"{BASE}/v1", api_key="x", http_client=http)

    plain = (llm().invoke(HI).content, "".join(c.content for c in llm().stream(HI)))
    with intercepting(rows):
        seen = (llm().invoke(HI).content, "".join(c.content for c in llm().stream(HI)))
    assert seen == plain == (CONTENT, CONTENT)
    assert [r.status for r in rows] == ["ok", "ok"]
    assert rows[1].ttft_ms is not None and rows[0].ttft_ms is None
    assert all(r.cached_tokens is not None for r in rows)


def test_other_hosts_and_paths_pass_untouched(rows: Rows) -> None:
    stub = Stub()
    with intercepting(rows), httpx2.Client(transport=stub.transport(httpx2)) as client:
        client.post("http://elsewhere:8000/v1/chat/completions", json={"messages": HI})
        client.post(f"{BASE}/v1/embeddings", json={"input": "hi"})
    assert rows == []
    assert all("request_id" not in body for _, body, _ in stub.received)


def test_a_loopback_engine_is_matched_under_any_loopback_name(rows: Rows) -> None:
    stub = Stub()
    ctx = CallContext("bench", "exp", "hash", "app", None, "smollm2", None, rows.append)
    engine = VllmEngine(EngineConfig())
    body = {"model": "m", "messages": HI}
    with (
        Interceptor(engine, "http://127.0.0.1:8000/v1", ctx),
        httpx2.Client(transport=stub.transport(httpx2)) as client,
    ):
        for url in ("http://localhost:8000", "http://[::1]:8000", "http://127.0.0.1:8000"):
            client.post(f"{url}/v1/chat/completions", json=body)
        client.post("http://localhost:8001/v1/chat/completions", json=body)  # another port
        client.post("https://localhost:8000/v1/chat/completions", json=body)  # scheme
    assert len(rows) == 3


def test_sglang_tags_join_the_app_headers(rows: Rows) -> None:
    stub = Stub()
    engine = SglangEngine(EngineConfig(kind="sglang"))
    from kvscope.probe.labels import agent

    with intercepting(rows, engine), agent("planner"):
        sdk(stub).chat.completions.create(
            model="m", messages=HI, extra_headers={"x-app": "1"}, extra_body={"rid": "mine"}
        )
    _, body, headers = stub.received[-1]
    assert json.loads(headers["x-custom-labels"]) == {"agent": "planner"}
    assert headers["x-app"] == "1"
    assert body["rid"] == "mine"  # the app's own field wins
    assert body["session_id"] == rows[0].request_uuid and rows[0].agent_id == "planner"
    with intercepting(rows, engine):  # no agent named: no (empty) agent label
        sdk(stub).chat.completions.create(model="m", messages=HI)
    _, body, headers = stub.received[-1]
    assert "x-custom-labels" not in headers and body["rid"] == rows[1].request_uuid


@pytest.mark.parametrize(
    ("stub", "error", "status", "error_type"),
    [
        (Stub(status=500), openai.InternalServerError, "error", "http_500"),
        (
            Stub(fail=httpx2.ConnectError("refused")),
            openai.APIConnectionError,
            "error",
            "connection",
        ),
        (Stub(fail=httpx2.ReadTimeout("slow")), openai.APITimeoutError, "timeout", "timeout"),
        (Stub(cut_after=4), openai.APIConnectionError, "error", "connection"),
    ],
    ids=["http-500", "connection", "timeout", "cut-off"],
)
def test_failed_calls_are_rows_and_the_app_gets_its_error(
    rows: Rows, stub: Stub, error: type[Exception], status: str, error_type: str
) -> None:
    with intercepting(rows), pytest.raises(error):
        chat_stream(sdk(stub))
    [r] = rows
    assert (r.status, r.error_type) == (status, error_type)
    assert r.error_message and r.e2e_ms is not None


def test_a_stream_the_app_leaves_early_is_an_incomplete_row(rows: Rows) -> None:
    with intercepting(rows):
        stream = sdk(Stub()).chat.completions.create(model="m", messages=HI, stream=True)
        next(iter(stream))
        stream.close()
    [r] = rows
    assert (r.status, r.error_type) == ("error", "incomplete_stream")


def original_sends() -> Iterator[Any]:
    for lib in (httpx, httpx2):
        yield lib.Client.send
        yield lib.AsyncClient.send


def test_nested_interceptors_uninstall_cleanly(rows: Rows) -> None:
    before = list(original_sends())
    outer = intercepting(rows)
    with outer:
        with outer, intercepting(Rows()):
            assert list(original_sends()) != before
        assert list(original_sends()) != before  # the outer one is still active
        sdk(Stub()).chat.completions.create(model="m", messages=HI)
    assert list(original_sends()) == before
    assert len(rows) == 1
    sdk(Stub()).chat.completions.create(model="m", messages=HI)
    assert len(rows) == 1


class Rewritten(Stub):
    """The stand-in vLLM with its stream events replaced."""

    def __init__(self, rewrite: Any) -> None:
        super().__init__()
        self.rewrite = rewrite

    def events(self, path: str, body: dict[str, Any]) -> list[str]:
        return self.rewrite(super().events(path, body))


def test_a_malformed_stream_is_a_row_and_the_app_gets_its_error(rows: Rows) -> None:
    stub = Rewritten(lambda events: ["data: {not json\n\n"])
    with intercepting(rows), pytest.raises(ValueError):
        chat_stream(sdk(stub), stream_options={"include_usage": True})
    [r] = rows
    assert (r.status, r.error_type) == ("error", "malformed_stream")
    assert r.error_message and r.prompt_tokens is None


def test_cached_tokens_not_reported_are_none_not_zero(rows: Rows) -> None:
    hide = '"prompt_tokens_details":null,"x":{'
    stub = Rewritten(lambda events: [e.replace('"prompt_tokens_details":{', hide) for e in events])
    with intercepting(rows):
        chat_stream(sdk(stub))
    [r] = rows
    assert r.status == "ok" and r.prompt_tokens == USAGE["usage"]["prompt_tokens"]
    assert (r.cached_tokens, r.new_prefill_tokens, r.reported_cache_hit_ratio) == (None, None, None)


@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_the_request_sent_is_a_new_one_and_the_apps_is_left_as_it_was(rows: Rows, lib: Any) -> None:
    """The request on the wire carries the app's headers in their order, then kvscope's, then the
    Content-Length of kvscope's body; the app's request object is not changed, so sending it
    again is a new call with a request id of its own."""
    from kvscope.probe.labels import agent

    inner, seen = Stub().transport(lib), []

    def handle(request: Any) -> Any:
        seen.append((request.headers.multi_items(), request.content))
        return inner.handler(request)

    client = lib.Client(transport=lib.MockTransport(handle))
    body = json.dumps({"model": "m", "messages": HI}).encode()
    headers = {"X-App": "1", "Content-Type": "application/json"}
    request = client.build_request("POST", f"{BASE}/v1/chat/completions", content=body,
                                   headers=headers)  # fmt: skip
    before = request.headers.multi_items()
    with intercepting(rows, SglangEngine(EngineConfig(kind="sglang"))), agent("planner"):
        for _ in range(2):
            client.send(request).read()
    assert request.content == body and request.headers.multi_items() == before
    assert len(rows) == 2 and rows[0].request_uuid != rows[1].request_uuid
    app = [(k, v) for k, v in before if k != "content-length"]
    for row, (sent_headers, content) in zip(rows, seen, strict=True):
        assert json.loads(content)["rid"] == row.request_uuid
        assert sent_headers[: len(app)] == app
        ours = [k for k, _ in sent_headers[len(app) :]]
        assert ours[-1] == "content-length" and "x-custom-labels" in ours
        assert json.loads(dict(sent_headers)["x-custom-labels"]) == {"agent": "planner"}
        assert dict(sent_headers)["content-length"] == str(len(content))
