"""The reply's stream as the app reads it, over a real socket (the stand-in vLLM served on
loopback, through httpx's and httpx2's own HTTP transports): the app sees what it would without
kvscope (the same bytes, its response's `elapsed`, its library's own exception when the
connection drops) and each call is one row that says how it ended."""

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import httpx
import httpx2
import openai
import openai._streaming_cleanup as streaming_cleanup
import pytest
from vllm_stub import USAGE_EVENT, Stub

from kvscope.config import EngineConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.intercept import Interceptor
from kvscope.probe.wire import CallContext
from kvscope.records.requests import RequestRecord

LIBS = pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
MODES = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
# the app asked for the usage: the engine's bytes reach it unchanged, so bare and kvscope compare
PAYLOAD = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
PAYLOAD |= {"stream_options": {"include_usage": True}}


@contextmanager
def intercepting(base: str, rows: list[RequestRecord]) -> Iterator[None]:
    ctx = CallContext("bench-1", "exp", "hash", "langgraph", 1, "smollm2", None, rows.append)
    with Interceptor(VllmEngine(EngineConfig()), base, ctx):
        yield


def read(lib: Any, base: str, asynchronous: bool, until: int | None = None) -> tuple[bytes, Any]:
    """POST the chat stream and read its body (`until`: that many chunks, then close): (the
    bytes, the response)."""
    url = f"{base}/v1/chat/completions"
    if not asynchronous:
        with lib.Client() as client, client.stream("POST", url, json=PAYLOAD) as response:
            chunks = []
            for chunk in response.iter_raw():
                chunks.append(chunk)
                if len(chunks) == until:
                    break
            return b"".join(chunks), response

    async def go() -> tuple[bytes, Any]:
        async with (
            lib.AsyncClient() as client,
            client.stream("POST", url, json=PAYLOAD) as response,
        ):
            chunks = []
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                if len(chunks) == until:
                    break
            return b"".join(chunks), response

    return asyncio.run(go())


@LIBS
@MODES
def test_the_app_reads_the_engines_bytes_and_its_elapsed_time(lib: Any, asynchronous: bool) -> None:
    """httpx2's response reads `elapsed` from its stream once closed (httpx's sets it on the
    response): an app that reads it (the OpenAI SDK's raw responses do) still can."""
    rows: list[RequestRecord] = []
    with Stub(delay_s=0.005).serve() as base:
        plain, _ = read(lib, base, asynchronous)
        with intercepting(base, rows):
            seen, response = read(lib, base, asynchronous)
    assert seen == plain and USAGE_EVENT.encode() in seen
    assert response.elapsed.total_seconds() > 0.005
    [r] = rows
    assert r.status == "ok" and r.prompt_tokens is not None and r.ttft_ms is not None


@LIBS
@MODES
def test_a_dropped_connection_raises_httpxs_own_error(lib: Any, asynchronous: bool) -> None:
    """httpcore's error is mapped to the app's library's, as without kvscope; the row says
    the connection failed."""
    rows: list[RequestRecord] = []
    errors: list[type] = []
    with Stub(cut_after=3).serve() as base:
        for profiling in (False, True):
            watched = intercepting(base, rows) if profiling else nullcontext()
            with watched, pytest.raises(lib.TransportError) as raised:
                read(lib, base, asynchronous)
            errors.append(type(raised.value))
    assert errors[0] is errors[1] and errors[0].__module__.startswith(lib.__name__)
    [r] = rows
    assert (r.status, r.error_type) == ("error", "connection")


@LIBS
@MODES
def test_a_reply_closed_early_is_an_incomplete_row(lib: Any, asynchronous: bool) -> None:
    rows: list[RequestRecord] = []
    with Stub(delay_s=0.002).serve() as base, intercepting(base, rows):
        part, _ = read(lib, base, asynchronous, until=2)
        whole, _ = read(lib, base, asynchronous)
    assert part and whole.startswith(part) and len(whole) > len(part)
    assert [(r.status, r.error_type) for r in rows] == [
        ("error", "incomplete_stream"),
        ("ok", None),
    ]


def test_the_sdks_drain_after_done_finds_nothing_more_to_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After [DONE] the OpenAI SDK drains the response by reading its stream again, awaiting an
    anyio checkpoint (a turn of the app's event loop) for each chunk it finds: through kvscope it
    finds none, as without it (an empty last chunk cost each call a loop turn under load)."""
    drained: list[bool] = []

    async def checkpoint() -> None:
        drained[-1] = True

    monkeypatch.setattr(streaming_cleanup, "checkpoint", checkpoint)

    async def chat(base: str) -> str:
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x") as client:
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    rows: list[RequestRecord] = []
    texts = []
    with Stub(delay_s=0.002).serve() as base:
        for profiling in (False, True):
            drained.append(False)
            with intercepting(base, rows) if profiling else nullcontext():
                texts.append(asyncio.run(chat(base)))
    assert texts[0] == texts[1] and texts[0]
    assert drained == [False, False]
    [r] = rows
    assert r.status == "ok"
