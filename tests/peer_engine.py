"""A scripted engine for the PEER app's tests: an `AsyncOpenAI` whose transport answers each chat
call with a reply chosen per agent, streamed in vLLM's shape (usage chunk when asked for).

A routing call (`response_format` with a string-enum JSON schema) is answered like any other:
the `reply` function sees its allowed replies as `Call.choices` and returns one (JSON-quoted).

The agent and thread of a call are read from LangGraph's run context where the transport runs
(the calling node's task), so the engine needs no help from the app; `turn` counts the agent's
calls in its thread (the PEER cycle). Requests go to BASE, so an Interceptor for BASE sees them.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from langchain_core.runnables.config import var_child_runnable_config

BASE = "http://engine:8000"
USAGE = {"prompt_tokens": 100, "completion_tokens": 8, "total_tokens": 108,
         "prompt_tokens_details": {"cached_tokens": 64}}  # fmt: skip


@dataclass(frozen=True)
class Call:
    agent: str
    thread_id: str
    turn: int  # the agent's k-th call in its thread, from 1
    body: dict[str, Any]
    meta: dict[str, Any]  # the node's `kvscope` metadata (the app's annotations)

    @property
    def messages(self) -> list[dict[str, str]]:
        return self.body["messages"]

    @property
    def choices(self) -> list[str] | None:
        """A routing call's allowed replies (its response_format's string enum), else None."""
        fmt = self.body.get("response_format")
        if not fmt:
            return None
        return list(fmt["json_schema"]["schema"]["enum"])


PLAN = "CALC: (2418.6 - 2105.3) / 2105.3 * 100\nSteps: growth over 2022."
REPLIES = {
    "planner": PLAN,
    "executor": "Revenue 2,418.6 vs 2,105.3; growth 14.88%.",
    "expresser": "Revenue grew 14.88%.",
    "reviewer": "Matches. VERDICT: DONE",
}


def default_reply(call: Call) -> str:
    """The agent's scripted text; a routing call's first choice, as JSON (`"planner"`)."""
    if call.choices is not None:
        return json.dumps(call.choices[0])
    return REPLIES.get(call.agent, f"{call.agent} output")


@dataclass
class ScriptedEngine:
    reply: Callable[[Call], str] = default_reply
    fail: Callable[[Call], bool] = lambda call: False  # answer HTTP 500
    delay_s: float = 0.0  # before the reply
    calls: list[Call] = field(default_factory=list)
    spans: dict[str, list[float]] = field(default_factory=dict)  # thread -> [first start, end]

    def client(self) -> openai.AsyncOpenAI:
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(self._handle))
        return openai.AsyncOpenAI(
            base_url=f"{BASE}/v1", api_key="x", max_retries=0, http_client=http
        )

    def by_thread(self) -> dict[str, list[Call]]:
        out: dict[str, list[Call]] = {}
        for call in self.calls:
            out.setdefault(call.thread_id, []).append(call)
        return out

    def max_threads_in_flight(self) -> int:
        """The most threads whose [first call, last reply] intervals overlap."""
        edges = sorted(
            [(s, 1) for s, _ in self.spans.values()] + [(e, -1) for _, e in self.spans.values()],
            key=lambda x: (x[0], x[1]),
        )
        now = most = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most

    async def _handle(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        config = var_child_runnable_config.get() or {}
        metadata = config.get("metadata") or {}
        agent = metadata.get("langgraph_node", "?")
        thread = str((config.get("configurable") or {}).get("thread_id"))
        turn = 1 + sum(1 for c in self.calls if c.thread_id == thread and c.agent == agent)
        call = Call(agent, thread, turn, body, dict(metadata.get("kvscope") or {}))
        self.calls.append(call)
        span = self.spans.setdefault(thread, [time.perf_counter(), 0.0])
        await asyncio.sleep(self.delay_s)
        span[1] = time.perf_counter()
        if self.fail(call):
            return httpx2.Response(500, json={"error": {"message": "boom"}})
        text = self.reply(call)
        usage = (body.get("stream_options") or {}).get("include_usage")
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_Events(text, usage)
        )


class _Events(httpx2.AsyncByteStream):
    def __init__(self, text: str, usage: bool) -> None:
        self.text, self.usage = text, usage

    async def __aiter__(self) -> AsyncIterator[bytes]:
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "smollm2"}
        words = self.text.split(" ")
        for i, word in enumerate(words):
            piece = word if i == 0 else " " + word
            choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            yield _event({**base, "choices": [choice]})
        yield _event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if self.usage:
            yield _event({**base, "choices": [], "usage": USAGE})
        yield b"data: [DONE]\n\n"


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"
