"""Prompt ids from the engine (vLLM's return_token_ids) through the interception: asked for,
read, and taken back out of what the app reads."""

import json
from typing import Any

import httpx2
import pytest
from test_intercept import BASE, HI, Rows
from vllm_stub import EVENTS, USAGE, Stub

from kvscope.config import EngineConfig
from kvscope.engines import vllm_ids
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.instrument import PromptInstrument
from kvscope.probe.intercept import Interceptor
from kvscope.probe.tokens import digest
from kvscope.probe.wire import CallContext
from kvscope.records.tokens import PromptTokenIds

PROMPT_TOKENS = USAGE["usage"]["prompt_tokens"]


class Captured(Rows):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[PromptTokenIds] = []

    def ctx(self) -> CallContext:
        instrument = PromptInstrument(None, self.ids.append)
        return CallContext("b", "e", "h", "langgraph", 1, "smollm2", None, self.append,
                           instrument=instrument)  # fmt: skip


def post(stub: Stub, path: str, payload: dict[str, Any], rows: Captured | None, engine: Any = None):
    with httpx2.Client(transport=stub.transport(httpx2)) as client:
        if rows is None:
            return client.post(BASE + path, json=payload).content
        with Interceptor(engine or VllmEngine(EngineConfig()), BASE, rows.ctx()):
            return client.post(BASE + path, json=payload).content


CASES = [
    ("/v1/chat/completions", {"model": "m", "messages": HI}),
    ("/v1/completions", {"model": "m", "prompt": "hi"}),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "payload"), CASES)
def test_engine_ids_make_the_row_and_the_app_reads_the_plain_reply(
    path: str, payload: dict[str, Any], stream: bool
) -> None:
    stub, rows = Stub(), Captured()
    payload = payload | {"stream": stream}
    plain = post(stub, path, payload, None)
    seen = post(stub, path, payload, rows)
    sent = stub.received[-1][1]
    assert sent["return_token_ids"] is True and "return_token_ids" not in payload
    assert seen == plain  # byte for byte what the engine sends without the flag
    assert b"[1,2,3," not in seen and b"[1, 2, 3," not in seen
    with_flag = post(stub, path, payload | {"return_token_ids": True}, None)
    assert b"1,2,3," in with_flag.replace(b" ", b"")  # the stub did send them
    [r] = rows
    assert r.status == "ok" and r.prompt_tokens == PROMPT_TOKENS
    assert (r.prompt_token_source, r.prompt_token_count) == ("engine", PROMPT_TOKENS)
    assert r.prompt_token_mismatch is False
    # no tokenizer: no chat text to hash; a completions prompt is its own text
    assert r.prompt_hash == (None if "chat" in path else digest(b"hi"))
    assert [(p.request_uuid, list(p.token_ids)) for p in rows.ids] == [
        (r.request_uuid, stub.prompt_ids)
    ]


def test_held_back_chunk_is_dropped_and_other_events_are_unchanged() -> None:
    stub, rows = Stub(held_back=True), Captured()
    payload = {"model": "m", "messages": HI, "stream": True}
    plain = post(stub, "/v1/chat/completions", payload, None)
    seen = post(stub, "/v1/chat/completions", payload, rows)
    assert seen == plain
    assert seen.count(b"data: ") == len(EVENTS) - 1  # every event but kvscope's usage chunk
    assert rows[0].prompt_token_source == "engine"


def test_an_app_that_asks_for_ids_gets_them_and_the_row_reads_them() -> None:
    stub, rows = Stub(), Captured()
    payload = {"model": "m", "messages": HI, "stream": True, "return_token_ids": True}
    payload["stream_options"] = {"include_usage": True}
    plain = post(stub, "/v1/chat/completions", payload, None)
    seen = post(stub, "/v1/chat/completions", payload, rows)
    assert seen == plain and b'"prompt_token_ids":[1,2,3,' in seen
    assert rows[0].prompt_token_source == "engine" and len(rows.ids) == 1


def test_an_app_that_turns_ids_off_or_echoes_is_not_asked() -> None:
    stub = Stub()
    for extra in ({"return_token_ids": False}, {"echo": True}):
        rows = Captured()
        post(stub, "/v1/chat/completions", {"model": "m", "messages": HI} | extra, rows)
        assert stub.received[-1][1].get("return_token_ids") is extra.get("return_token_ids")
        assert rows[0].prompt_token_source is None and rows.ids == []  # no tokenizer either


@pytest.mark.parametrize("stream", [False, True])
def test_ids_that_disagree_with_prompt_tokens_are_flagged_and_not_written(stream: bool) -> None:
    stub, rows = Stub(prompt_ids=[5, 6, 7]), Captured()
    payload = {"model": "m", "messages": HI, "stream": stream}
    assert post(stub, "/v1/chat/completions", payload, rows) == post(
        stub, "/v1/chat/completions", payload, None
    )
    [r] = rows
    assert (r.prompt_token_source, r.prompt_token_count) == ("engine", 3)
    assert r.prompt_token_mismatch is True and r.prompt_tokens == PROMPT_TOKENS
    assert (r.token_id_hash, r.fixed_prefix_tokens, r.dynamic_suffix_tokens) == (None,) * 3
    assert rows.ids == []


def test_without_ids_edits_only_the_id_lists() -> None:
    text = 'say \\"token_ids\\":[1,2] please'
    chunk = {"choices": [{"delta": {"content": text}, "token_ids": [4, 5]}]}
    raw = json.dumps(chunk, separators=(",", ":")).encode()
    out = vllm_ids.without_ids(b"data: " + raw + b"\n\n", chunk)
    assert out is not None
    back = json.loads(out[6:])
    assert (
        back["choices"][0]["delta"]["content"] == text and back["choices"][0]["token_ids"] is None
    )
    assert vllm_ids.prompt_ids({"prompt_token_ids": [1, "x"]}) is None
    assert vllm_ids.prompt_ids({"choices": [{"prompt_token_ids": [3, 4]}]}) == [3, 4]


def _nulled(value: Any) -> Any:
    """The reference edit: every id list (prompt_token_ids / token_ids) set to null."""
    if isinstance(value, dict):
        return {k: None if k in ("prompt_token_ids", "token_ids") and isinstance(v, list)
                else _nulled(v) for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_nulled(v) for v in value]
    return value


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])  # vLLM's compact, spaced
@pytest.mark.parametrize(
    "reply",
    [
        {"choices": [{"delta": {"role": "assistant"}, "token_ids": None}],
         "prompt_token_ids": list(range(600))},
        {"prompt_token_ids": [1, 2], "choices": [{"message": {"content": "x"},
                                                 "token_ids": [7, 8]}]},
        {"choices": [{"text": "a", "prompt_token_ids": [1], "token_ids": [2]},
                     {"text": "b", "prompt_token_ids": [3, 4], "token_ids": []}]},
        {"choices": [{"delta": {"content": 'a \\"token_ids\\":[1] "prompt_token_ids":[2]'},
                      "token_ids": [5]}]},
        {"choices": [], "usage": {"prompt_tokens": 3}},
    ],
)  # fmt: skip
def test_without_ids_nulls_every_id_list_and_nothing_else(
    reply: dict[str, Any], separators: tuple[str, str]
) -> None:
    raw = json.dumps(reply, separators=separators).encode()
    want = json.dumps(_nulled(reply), separators=separators).encode()
    assert vllm_ids.without_ids(raw, None) == want
    assert vllm_ids.without_ids(b"data: " + raw + b"\n\n", reply) == b"data: " + want + b"\n\n"
    assert vllm_ids.may_be_added(b"data: " + raw + b"\n\n") is False  # no empty delta


def test_only_an_empty_delta_may_be_a_chunk_the_flag_brings() -> None:
    for delta in ('"delta":{}', '"delta": {}', '"delta" : { }'):
        assert vllm_ids.may_be_added(b'data: {"choices":[{' + delta.encode() + b"}]}\n\n")
    assert not vllm_ids.may_be_added(b'data: {"choices":[{"delta":{"content":"{}"}}]}\n\n')


@pytest.mark.parametrize("piece_bytes", [1, 7, 200, 1 << 20], ids=["1", "7", "200", "all"])
@pytest.mark.parametrize("held_back", [False, True])
@pytest.mark.parametrize(("path", "payload"), CASES)
def test_the_reply_read_in_any_pieces_is_edited_the_same(
    path: str, payload: dict[str, Any], held_back: bool, piece_bytes: int
) -> None:
    """The stream read a byte at a time, in pieces that cut events, or in one piece holding them
    all (a run of events edited at once): the app gets what the engine sends without the flag,
    byte for byte, and the row reads the same ids and tokens as event by event."""
    payload = payload | {"stream": True}
    plain = post(Stub(held_back=held_back), path, payload, None)
    stub, rows = Stub(held_back=held_back, piece_bytes=piece_bytes), Captured()
    assert post(stub, path, payload, rows) == plain
    [r] = rows
    assert r.status == "ok" and r.output_tokens == USAGE["usage"]["completion_tokens"]
    assert r.ttft_ms is not None and r.prompt_tokens == PROMPT_TOKENS
    assert [list(p.token_ids) for p in rows.ids] == [stub.prompt_ids]
    if "chat" in path:  # a held-back chunk is dropped however it arrived
        assert b'"delta":{}' not in post(stub, path, payload, Captured())
