"""A stand-in vLLM for httpx / httpx2 MockTransport: the recorded replies of vLLM 0.32.0.

/v1/chat/completions answers with tests/fixtures/vllm-0.32.0's recorded reply or stream; the
usage chunk is sent only when the request asks for it (stream_options.include_usage), as vLLM
does. /v1/completions answers the same tokens in the completions shape (`text`, and the per-choice
`prompt_token_ids` / `token_ids` keys, null). Every request is kept in `received` as (url, JSON
body, headers).

`return_token_ids: true` is honoured as vLLM 0.32.0 does it (its chat_completion/serving.py and
completion/serving.py): the null id fields become lists in place, every other byte the same:
chat: the top-level `prompt_token_ids` of the first chunk (or of the body) and each later
chunk's (each choice's) `token_ids`; completions: the first chunk's (every choice's)
`prompt_token_ids` and every `token_ids`. `held_back` adds the empty-delta chat chunk vLLM sends
only with the flag, where a tool or reasoning parser holds a token back.
"""

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    chunk.pop("prompt_token_ids", None)
    chunk.pop("prompt_text", None)
    for choice in chunk["choices"]:
        choice["text"] = choice.pop("delta", {}).get("content") or ""
        choice |= {"prompt_token_ids": None, "token_ids": None}
    return "data: " + json.dumps(chunk) + "\n\n"


def with_ids(event: str, prompt_ids: list[int] | None, token_id: int) -> str:
    """One event as vLLM sends it with return_token_ids (module docstring)."""
    ids = json.dumps(prompt_ids).replace(" ", "")
    if '"choices": [' in event:  # completions (json.dumps's separators)
        if prompt_ids is not None:
            event = event.replace('"prompt_token_ids": null', f'"prompt_token_ids": {ids}', 1)
        return re.sub(r'"token_ids": null', f'"token_ids": [{token_id}]', event)
    if prompt_ids is not None:
        event = event.replace('"prompt_token_ids":null', f'"prompt_token_ids":{ids}', 1)
    return event.replace('"token_ids":null', f'"token_ids":[{token_id}]')


@dataclass
class Stub:
    """The engine: its replies, the requests it got, and how it misbehaves on demand."""

    delay_s: float = 0.0  # between stream events
    status: int = 200
    fail: BaseException | None = None  # raised instead of answering
    cut_after: int | None = None  # the stream breaks after this many events
    received: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    # what return_token_ids returns (the recorded prompt was 592 tokens long)
    prompt_ids: list[int] = field(default_factory=lambda: list(range(1, 593)))
    held_back: bool = False  # with return_token_ids: a held-back chunk after the first content
    piece_bytes: int | None = None  # the stream sent in pieces of this many bytes (None: events)

    def events(self, path: str, body: dict[str, Any]) -> list[str]:
        wants_usage = (body.get("stream_options") or {}).get("include_usage")
        events = [e for e in EVENTS if wants_usage or e != USAGE_EVENT]
        if "chat" not in path:
            events = [as_completion(e) for e in events]
        if not body.get("return_token_ids"):
            return events
        out = [
            with_ids(e, self.prompt_ids if i == 0 else None, 100 + i) for i, e in enumerate(events)
        ]
        if self.held_back and "chat" in path:
            held = json.loads(out[1][6:])
            held["choices"][0] |= {"delta": {}, "token_ids": [99]}
            out.insert(2, "data: " + json.dumps(held, separators=(",", ":")) + "\n\n")
        return out

    def reply(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = json.loads(json.dumps(REPLY))
        ids = body.get("return_token_ids")
        if "chat" in path:
            reply["prompt_token_ids"] = self.prompt_ids if ids else None
        else:
            del reply["prompt_token_ids"], reply["prompt_text"]
        for choice in reply["choices"]:
            choice["token_ids"] = [100, 101] if ids else None
            if "chat" not in path:
                choice["text"] = choice.pop("message")["content"]
                choice["prompt_token_ids"] = self.prompt_ids if ids else None
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
                return lib.Response(200, json=self.reply(request.url.path, body))
            events = [e.encode() for e in self.events(request.url.path, body)]
            if self.piece_bytes is not None:  # cut anywhere: inside events, several in one
                text, n = b"".join(events), self.piece_bytes
                events = [text[i : i + n] for i in range(0, len(text), n)]
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

    @contextmanager
    def serve(self) -> Iterator[str]:
        """The stand-in on a real loopback socket (HTTP/1.1 in a thread; a stream chunked, one
        event a write; `cut_after`: the connection dropped there, mid-body): its base URL."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                stub.received.append((self.path, body, dict(self.headers)))
                if not body.get("stream"):
                    data = json.dumps(stub.reply(self.path, body)).encode()
                    self._head({"content-type": "application/json", "content-length": len(data)})
                    self.wfile.write(data)
                    return
                self._head({"content-type": "text/event-stream", "transfer-encoding": "chunked"})
                for i, event in enumerate(stub.events(self.path, body)):
                    if stub.cut_after is not None and i == stub.cut_after:
                        self.close_connection = True  # no last chunk: the body is cut off
                        return
                    time.sleep(stub.delay_s)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event.encode()))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def _head(self, headers: dict[str, Any]) -> None:
                self.send_response(200)
                for name, value in headers.items():
                    self.send_header(name, str(value))
                self.end_headers()

            def log_message(self, *_: Any) -> None:  # quiet
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        server.request_queue_size = 128  # calls at once (the default backlog is 5)
        server.server_bind()
        server.server_activate()
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


class Scripted(Stub):
    """The stand-in vLLM scripted for tool-calling agents: a request offering the script's next
    tool gets a call of it (one per request, in the script's order); the others the recording."""

    def __init__(self, *script: str) -> None:
        super().__init__()
        self.script = list(script)

    def transport(self, lib: Any, asynchronous: bool = False) -> Any:
        plain = super().transport(lib, asynchronous)  # the recorded replies

        def handle(request: Any) -> Any:
            body = json.loads(request.content)
            offered = {t["function"]["name"] for t in body.get("tools", [])}
            if not self.script or self.script[0] not in offered:
                return plain.handle_request(request)
            self.received.append((str(request.url), body, dict(request.headers)))
            function = {"name": self.script.pop(0), "arguments": "{}"}
            call = {"id": f"c{len(self.received)}", "type": "function", "function": function}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return lib.Response(200, json={**REPLY, "choices": [choice]})

        return lib.MockTransport(handle)
