"""A stand-in vLLM for httpx / httpx2 MockTransport: the recorded replies of vLLM 0.32.0.

/v1/chat/completions answers with tests/fixtures/vllm-0.32.0's recorded reply or stream; the
usage chunk is sent only when the request asks for it (stream_options.include_usage), as vLLM
does. /v1/completions answers the same tokens in the completions shape (`text`). Every request
is kept in `received` as (url, JSON body, headers).
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from helpers import VLLM_FIXTURES

SSE = (VLLM_FIXTURES / "chat_completion_stream.sse").read_text()
REPLY = json.loads((VLLM_FIXTURES / "chat_completion.json").read_text())
EVENTS = [e + "\n\n" for e in SSE.split("\n\n") if e.strip()]
USAGE_EVENT = next(e for e in EVENTS if '"usage":{' in e)
USAGE = json.loads(USAGE_EVENT[len("data: ") :])
CONTENT = "".join(
    (json.loads(e[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
    for e in EVENTS
    if e.startswith("data: {")
)


def as_completion(event: str) -> str:
    """A chat stream event in the completions shape (`text` instead of `delta.content`)."""
    if not event.startswith("data: {"):
        return event
    chunk = json.loads(event[6:])
    chunk["object"] = "text_completion"
    for choice in chunk["choices"]:
        choice["text"] = choice.pop("delta", {}).get("content") or ""
    return "data: " + json.dumps(chunk) + "\n\n"


@dataclass
class Stub:
    """The engine: its replies, the requests it got, and how it misbehaves on demand."""

    delay_s: float = 0.0  # between stream events
    status: int = 200
    fail: BaseException | None = None  # raised instead of answering
    cut_after: int | None = None  # the stream breaks after this many events
    received: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)

    def events(self, path: str, body: dict[str, Any]) -> list[str]:
        wants_usage = (body.get("stream_options") or {}).get("include_usage")
        events = [e for e in EVENTS if wants_usage or e != USAGE_EVENT]
        return events if "chat" in path else [as_completion(e) for e in events]

    def reply(self, path: str) -> dict[str, Any]:
        if "chat" in path:
            return REPLY
        reply = json.loads(json.dumps(REPLY))
        for choice in reply["choices"]:
            choice["text"] = choice.pop("message")["content"]
        return reply

    def transport(self, lib: Any, asynchronous: bool = False) -> Any:
        def handle(request: Any) -> Any:
            body = json.loads(request.content)
            self.received.append((str(request.url), body, dict(request.headers)))
            if self.fail is not None:
                raise self.fail
            if self.status >= 400:
                return lib.Response(self.status, json={"error": {"message": "boom"}})
            if not body.get("stream"):
                return lib.Response(200, json=self.reply(request.url.path))
            events = [e.encode() for e in self.events(request.url.path, body)]
            stream = self._async(lib, events) if asynchronous else self._sync(lib, events)
            return lib.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

        return lib.MockTransport(handle)

    def _sync(self, lib: Any, events: list[bytes]) -> Any:
        stub = self

        class Events(lib.SyncByteStream):  # type: ignore[misc,name-defined]
            def __iter__(self) -> Iterator[bytes]:
                for i, event in enumerate(events):
                    if stub.cut_after is not None and i == stub.cut_after:
                        raise lib.RemoteProtocolError("peer closed connection")
                    time.sleep(stub.delay_s)
                    yield event

        return Events()

    def _async(self, lib: Any, events: list[bytes]) -> Any:
        stub = self

        class Events(lib.AsyncByteStream):  # type: ignore[misc,name-defined]
            async def __aiter__(self) -> AsyncIterator[bytes]:
                for i, event in enumerate(events):
                    if stub.cut_after is not None and i == stub.cut_after:
                        raise lib.RemoteProtocolError("peer closed connection")
                    await asyncio.sleep(stub.delay_s)
                    yield event

        return Events()
