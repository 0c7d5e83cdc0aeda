"""SGLang's prompt ids (engines/sglang_ids.py: `return_input_ids_in_sglext`) against the replies
of a live SGLang 0.5.23 server (tests/fixtures/sglang-0.5.23/prompt_ids), on their own and
through the interception: asked for, read, and taken back out of what the app reads."""

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from helpers import SGLANG_FIXTURES
from test_engine_prompt_ids import Captured
from test_intercept import BASE, HI
from vllm_stub import Stub

from kvscope.config import EngineConfig
from kvscope.engines import sglang_ids
from kvscope.engines.sglang import SglangEngine
from kvscope.probe.intercept import Interceptor

RECORDED = SGLANG_FIXTURES / "prompt_ids"
PAIRS = ["chat", "chat_details", "chat_stream"]
FIELD = sglang_ids.FIELD
_EVENT = re.compile(rb".*?\r?\n\r?\n", re.S)
# What differs between the two calls of a pair besides the flag: their id, their clock, and how
# much of the prompt the prefix cache held when each was sent (chat: 4, then 21 tokens).
_SAME_CALL = [
    (re.compile(rb'"id":"fx-with(?:out)?-(\d+)"'), rb'"id":"fx-\1"'),
    (re.compile(rb'"created":\d+'), b'"created":1795817666'),
    (re.compile(rb'"cached_tokens":\d+'), b'"cached_tokens":21'),
]


def recorded(name: str, flag: bool) -> bytes:
    [path] = RECORDED.glob(f"{name}.{'with' if flag else 'without'}.*")
    return path.read_bytes()


def same_call(data: bytes) -> bytes:
    """A recorded reply as if both calls of its pair were one call (module comment above)."""
    for pattern, value in _SAME_CALL:
        data = pattern.sub(value, data)
    return data


def events(data: bytes) -> list[bytes]:
    out = _EVENT.findall(data)
    assert b"".join(out) == data  # every byte is in an event
    return out


def chunk_of(event: bytes) -> dict[str, Any] | None:
    """An SSE event's JSON, as probe/wire.py reads it; None for `[DONE]`."""
    lines = event.splitlines()
    data = b"\n".join(s[5:].lstrip() for s in lines if s.startswith(b"data:"))
    return None if data.strip() == b"[DONE]" else json.loads(data)


def without_ids(name: str, data: bytes) -> bytes:
    """sglang_ids.without_ids over a whole reply, event by event for a stream."""
    if not name.endswith("_stream"):
        out = sglang_ids.without_ids(data, None)
        assert out is not None
        return out
    kept = []
    for event in events(data):
        chunk = chunk_of(event)
        edited = event if chunk is None else sglang_ids.without_ids(event, chunk)
        kept += [] if edited is None else [edited]
    return b"".join(kept)


def ids_in(name: str, data: bytes) -> tuple[list[list[int]], int]:
    """(the prompt ids read from each reply body or chunk that has them, usage.prompt_tokens)."""
    if not name.endswith("_stream"):
        reply = json.loads(data)
        found = sglang_ids.prompt_ids(reply)
        return ([] if found is None else [found]), reply["usage"]["prompt_tokens"]
    chunks = [c for c in map(chunk_of, events(data)) if c is not None]
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    return [i for i in map(sglang_ids.prompt_ids, chunks) if i is not None], usage["prompt_tokens"]


IDS = ids_in("chat", recorded("chat", True))[0][0]
PROMPT_TOKENS = len(IDS)


@pytest.mark.parametrize("name", PAIRS)
def test_the_reply_without_its_ids_is_the_recorded_reply_without_the_flag(name: str) -> None:
    with_ids, without = recorded(name, True), recorded(name, False)
    assert b'"input_ids"' in with_ids and b'"input_ids"' not in without
    assert same_call(with_ids) != same_call(without)  # the flag changed the reply
    assert same_call(without_ids(name, with_ids)) == same_call(without)  # byte for byte
    assert without_ids(name, without) == without  # a reply without ids is left as it is


def test_only_the_chunk_the_flag_brings_is_dropped() -> None:
    with_ids = events(recorded("chat_stream", True))
    kept = [e for e in with_ids if sglang_ids.without_ids(e, chunk_of(e)) is not None]
    [dropped] = [e for e in with_ids if e not in kept]
    chunk = chunk_of(dropped) or {}
    assert (chunk["choices"], chunk["usage"], chunk["sglext"]) == ([], None, {"input_ids": IDS})
    assert kept == with_ids[:-3] + with_ids[-2:]  # the usage chunk and [DONE] follow it
    assert all(sglang_ids.without_ids(e, chunk_of(e)) == e for e in kept)  # unchanged


@pytest.mark.parametrize("name", PAIRS)
def test_prompt_ids_are_read_once_and_count_as_the_prompt_tokens(name: str) -> None:
    found, prompt_tokens = ids_in(name, recorded(name, True))
    assert found == [IDS]  # one body or chunk has them; the same prompt in every recording
    assert len(IDS) == prompt_tokens == 22
    assert ids_in(name, recorded(name, False))[0] == []


def test_prompt_ids_only_from_a_list_of_ints() -> None:
    assert sglang_ids.prompt_ids({"sglext": {"input_ids": [1, 2]}}) == [1, 2]
    for bad in ([1, "2"], [1, 2.0], [True], "1,2", None):
        assert sglang_ids.prompt_ids({"sglext": {"input_ids": bad}}) is None
    assert sglang_ids.prompt_ids({"sglext": [1, 2]}) is None
    assert sglang_ids.prompt_ids({"input_ids": [1, 2]}) is None  # only sglext's


def test_the_field_is_asked_for_on_chat_only_and_never_over_the_apps_own() -> None:
    chat = {"model": "m", "messages": HI}
    assert sglang_ids.request_fields(chat) == {FIELD: True}
    assert sglang_ids.request_fields(chat | {"stream": True}) == {FIELD: True}
    for own in (True, False):
        assert sglang_ids.request_fields(chat | {FIELD: own}) == {}
    assert sglang_ids.request_fields({"model": "m", "prompt": "hi"}) == {}


def test_input_ids_text_in_a_message_is_not_touched() -> None:
    text = 'quote: "input_ids":[1,2] and ,"sglext":{"input_ids":[3]}'
    reply = json.loads(recorded("chat_details", True))
    reply["choices"][0]["message"]["content"] = text
    data = json.dumps(reply, separators=(",", ":")).encode()
    out = sglang_ids.without_ids(data, None)
    del reply["sglext"]["input_ids"]
    assert out == json.dumps(reply, separators=(",", ":")).encode()
    # a streamed content chunk with that text and no ids: every byte as it came
    chunk = json.loads(recorded("chat_stream", True).split(b"\n\n")[1][6:])
    chunk["choices"][0]["delta"]["content"] = text
    event = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    assert sglang_ids.without_ids(event, chunk) == event


IDS_CHUNK = json.loads(events(recorded("chat_stream", True))[-3][6:])
DETAILS = {"device": 21, "host": 0}


@pytest.mark.parametrize(
    "sglext",  # in SGLang's member order (protocol.SglExt): input_ids first, between, last
    [
        {"cached_tokens_details": DETAILS, "input_ids": [1, 2]},
        {"input_ids": [1, 2], "output_ids": [[5, 6]]},
        {"cached_tokens_details": DETAILS, "input_ids": [1, 2], "output_ids": [[5, 6]]},
    ],
)
def test_a_chunk_with_more_in_sglext_is_edited_not_dropped(sglext: dict[str, Any]) -> None:
    chunk = IDS_CHUNK | {"sglext": sglext}
    event = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    out = sglang_ids.without_ids(event, chunk)
    rest = {k: v for k, v in sglext.items() if k != "input_ids"}
    plain = json.dumps(chunk | {"sglext": rest}, separators=(",", ":")).encode()
    assert out == b"data: " + plain + b"\n\n"  # what SGLang sends without the flag


def test_the_ids_event_of_a_framed_stream_is_dropped() -> None:
    """With the app's `x-sglext-ids-framed: 1`, SGLang sends the ids in an event of their own."""
    data = b"event: sglext_ids\n" + events(recorded("chat_stream", True))[-3]
    assert sglang_ids.without_ids(data, chunk_of(data)) is None


JSON = ("content-type", "application/json")
SSE = ("content-type", "text/event-stream")


class Recorded:
    """A stand-in SGLang 0.5.23 for an httpx2 MockTransport: it answers a chat call with the
    recorded reply (`chat_stream` for a stream, `chat_details` where the body asks for
    return_cached_tokens_details, else `chat`), the `.with` file where the body sets the flag,
    else the `.without` one, both as of one call (same_call). As SGLang, it sends the usage
    chunk only where the body asks for it. A stream comes in pieces of PIECE bytes, across event
    boundaries. Every body it got is in `received`."""

    PIECE = 100

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []

    def reply(self, body: dict[str, Any]) -> bytes:
        stream = bool(body.get("stream"))
        name = "chat_stream" if stream else "chat"
        name += "_details" if body.get("return_cached_tokens_details") and not stream else ""
        data = same_call(recorded(name, bool(body.get(FIELD))))
        if stream and not (body.get("stream_options") or {}).get("include_usage"):
            data = b"".join(e for e in events(data) if b'"usage":{' not in e)
        return data

    def transport(self) -> httpx2.MockTransport:
        def handle(request: httpx2.Request) -> httpx2.Response:
            body = json.loads(request.content)
            self.received.append(body)
            data = self.reply(body)
            if not body.get("stream"):
                return httpx2.Response(200, headers=[JSON], content=data)
            pieces = [data[i : i + self.PIECE] for i in range(0, len(data), self.PIECE)]
            return httpx2.Response(200, headers=[SSE], stream=Pieces(pieces))

        return httpx2.MockTransport(handle)


class Pieces(httpx2.SyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        yield from self.pieces


def post(engine: Recorded, payload: dict[str, Any], rows: Captured | None) -> bytes:
    with httpx2.Client(transport=engine.transport()) as client:
        if rows is None:
            return client.post(BASE + "/v1/chat/completions", json=payload).content
        with Interceptor(SglangEngine(EngineConfig(kind="sglang")), BASE, rows.ctx()):
            return client.post(BASE + "/v1/chat/completions", json=payload).content


CALLS = {
    "chat": {},
    "chat_details": {"return_cached_tokens_details": True},
    "chat_stream": {"stream": True, "stream_options": {"include_usage": True}},
    "chat_stream_no_usage": {"stream": True},  # kvscope asks for usage too and takes it out
}


@pytest.mark.parametrize("extra", CALLS.values(), ids=CALLS.keys())
def test_sglang_is_asked_and_the_app_reads_the_reply_without_the_flag(
    extra: dict[str, Any],
) -> None:
    engine, rows = Recorded(), Captured()
    payload = {"model": "x", "messages": HI, "temperature": 0, "max_tokens": 4} | extra
    plain = post(engine, payload, None)
    seen = post(engine, payload, rows)
    sent = engine.received[-1]
    assert sent[FIELD] is True and FIELD not in payload
    assert b'"input_ids"' in engine.reply(sent)  # the engine did send them
    assert seen == plain  # byte for byte what SGLang sends without the flag
    assert b'"input_ids"' not in seen
    [r] = rows
    assert r.status == "ok" and r.prompt_tokens == PROMPT_TOKENS
    assert (r.prompt_token_source, r.prompt_token_count) == ("engine", PROMPT_TOKENS)
    assert r.prompt_token_mismatch is False
    assert [(p.request_uuid, list(p.token_ids)) for p in rows.ids] == [(r.request_uuid, IDS)]


@pytest.mark.parametrize("stream", [False, True])
def test_an_app_that_asks_for_ids_gets_them_and_the_row_reads_them(stream: bool) -> None:
    engine, rows = Recorded(), Captured()
    payload = {"model": "x", "messages": HI, "stream": stream, FIELD: True}
    payload["stream_options"] = {"include_usage": True}
    seen = post(engine, payload, rows)
    assert seen == post(engine, payload, None) and b'"input_ids":[' in seen
    assert rows[0].prompt_token_source == "engine" and len(rows.ids) == 1


def test_an_app_that_turns_ids_off_is_not_asked() -> None:
    engine, rows = Recorded(), Captured()
    payload = {"model": "x", "messages": HI, FIELD: False}
    assert post(engine, payload, rows) == post(engine, payload, None)
    assert engine.received[-1][FIELD] is False
    assert rows[0].prompt_token_source is None and rows.ids == []  # no tokenizer either


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": HI}),
        ("/v1/completions", {"model": "m", "prompt": "hi"}),
    ],
)
def test_sglang_is_asked_with_its_own_field_on_chat_only(
    path: str, payload: dict[str, Any]
) -> None:
    stub, rows = Stub(), Captured()  # what is sent is checked; the replies are vLLM's
    with (
        httpx2.Client(transport=stub.transport(httpx2)) as client,
        Interceptor(SglangEngine(EngineConfig(kind="sglang")), BASE, rows.ctx()),
    ):
        client.post(BASE + path, json=payload)
    sent = stub.received[-1][1]
    assert "return_token_ids" not in sent  # vLLM's field is not SGLang's
    assert sent.get(FIELD) is (True if "chat" in path else None)
