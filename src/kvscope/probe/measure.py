"""What one OpenAI-compatible reply said, and the measured columns of its row.

Used by the interception of an app's calls (probe/intercept.py, probe/wire.py), so that every
call's stream, usage and failure are read the same way:

- TTFT: submission -> the first generated token, content or reasoning (a reasoning model's
  stream starts with `reasoning_content` deltas, vLLM's and SGLang's reasoning parsers; newer
  vLLM names the field `reasoning`); TPOT: first -> last generated token of either kind over
  (output_tokens - 1), output_tokens counting both; e2e: submission -> the end of the reply. A
  non-streamed reply has e2e only.
- usage: prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens and
  completion_tokens_details.reasoning_tokens, from the usage chunk of a stream or the body of a
  reply; what the engine did not report stays None.
- a failure is (status, error_type, error_message): `timeout`, `http_<code>`, `connection`,
  `malformed_stream`, `incomplete_stream`, `response_failed`.

The Responses API (/v1/responses) is read into the same columns (`Seen.take_event`,
`Seen.take_response`; what vLLM 0.32.0 sends, read in its entrypoints/openai/responses/):

- a stream is typed SSE events, `event: <type>` and `data: {"type": <type>, ...}`, with no
  `[DONE]`: `response.created` carries the response id, `response.output_text.delta` and
  `response.reasoning_text.delta` / `response.reasoning_summary_text.delta` the generated text
  (TTFT, TPOT as for chat), and `response.completed` (or `response.incomplete`) the whole
  response, whose usage is always there: no `stream_options` to ask for it. A non-streamed reply
  is that response object.
- usage: input_tokens -> prompt_tokens, output_tokens, input_tokens_details.cached_tokens,
  output_tokens_details.reasoning_tokens (stored in the chat shape, `Seen.usage`).
- finish_reason in chat's words: status `completed` -> `tool_calls` when an output item is a
  function call, else `stop`; `incomplete` -> `length` for incomplete_details.reason
  `max_output_tokens`, else that reason; any other status (`failed`, `cancelled`) as it is.
- an `error` event, a `response.failed` event (its response's `error`) or a data line that is an
  `{"error": ...}` object fails the call: `http_<code>` where the error's code is an HTTP status,
  else `response_failed`, with its message.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import orjson

from kvscope.records.requests import STATUS_ERROR, STATUS_TIMEOUT, derived_cache

try:  # openai>=3 speaks httpx2, an API-identical twin of httpx with classes of its own
    import httpx2
except ImportError:  # pragma: no cover - openai<3
    httpx2 = None

HTTPX_LIBS = tuple(lib for lib in (httpx, httpx2) if lib is not None)


def _lib_errors(name: str) -> tuple[type[BaseException], ...]:
    return tuple(getattr(lib, name) for lib in HTTPX_LIBS)


# What a call can fail with and still be a row: the SDK's errors, the HTTP client's, a bad reply.
CALL_ERRORS: tuple[type[BaseException], ...] = (
    openai.APIError,
    *_lib_errors("TransportError"),
    ValueError,  # json.JSONDecodeError included
    KeyError,
    TypeError,
)


@dataclass
class Seen:
    """What a reply said, as it was read; `final` is the chunk or body that carried the usage
    (with any engine extras, such as vLLM's per-request `metrics`)."""

    first_token: float | None = None
    last_token: float | None = None
    content: str = ""
    usage: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    finish_reason: str | None = None
    response_id: str | None = None
    error: tuple[str, str] | None = None  # (error_type, message) a Responses stream reported
    ended: bool = False  # a Responses stream's terminal event arrived

    def take_chunk(self, chunk: dict[str, Any], now: float) -> None:
        """One streamed chunk (chat `delta.content` or completions `text`, or a reasoning
        model's `delta.reasoning_content` / `delta.reasoning`), read at `now`."""
        self.response_id = self.response_id or chunk.get("id")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content") or choice.get("text")
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if text or thought:
                if self.first_token is None:
                    self.first_token = now
                self.last_token = now
            if text:
                self.content += text
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            self.final = chunk

    def take_reply(self, body: dict[str, Any]) -> None:
        """A whole non-streamed reply (chat `message.content` or completions `text`)."""
        self.response_id = body.get("id")
        for choice in body.get("choices") or []:
            message = choice.get("message") or {}
            self.content += message.get("content") or choice.get("text") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        self.usage = body.get("usage") or None
        self.final = body

    def take_event(self, event: dict[str, Any], now: float) -> None:
        """One streamed Responses API event (module docstring), read at `now`."""
        kind = event.get("type")
        if kind in _TEXT_DELTAS or kind in _THOUGHT_DELTAS:
            delta = event.get("delta")
            if delta:
                if self.first_token is None:
                    self.first_token = now
                self.last_token = now
                if kind in _TEXT_DELTAS:
                    self.content += delta
        elif kind in ("response.created", "response.in_progress"):
            response = event.get("response") or {}
            self.response_id = self.response_id or response.get("id")
        elif kind in _RESPONSE_ENDS:
            self.ended = True
            self.take_response(event["response"], streamed=True)
        elif kind == "error" or "error" in event:
            self.ended = True
            self.error = _error(event.get("error") if "error" in event else event)

    def take_response(self, body: dict[str, Any], streamed: bool = False) -> None:
        """A whole Responses API response: a non-streamed reply, or the one a stream's
        terminal event carries (`streamed`: its text was read from the deltas)."""
        self.response_id = body.get("id") or self.response_id
        output = body.get("output") or []
        if not streamed:
            self.content = "".join(
                part.get("text") or ""
                for item in output
                if item.get("type") == "message"
                for part in item.get("content") or []
                if part.get("type") == "output_text"
            )
        usage = body.get("usage")
        if usage:
            self.usage = _chat_usage(usage)
        self.final = body
        status = body.get("status")
        if status == "completed":
            calls = any(item.get("type") == "function_call" for item in output)
            self.finish_reason = "tool_calls" if calls else "stop"
        elif status == "incomplete":
            reason = (body.get("incomplete_details") or {}).get("reason")
            self.finish_reason = "length" if reason == "max_output_tokens" else reason
        elif isinstance(status, str):
            self.finish_reason = status
        if status == "failed":
            self.error = _error(body.get("error") or {})


_TEXT_DELTAS = ("response.output_text.delta",)
_THOUGHT_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
_RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")


def _chat_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """A Responses API usage in the chat shape that `measured` reads (a count it lacks: None)."""
    details = usage.get("input_tokens_details")
    out_details = usage.get("output_tokens_details")
    return {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
        "prompt_tokens_details": {
            "cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None
        },
        "completion_tokens_details": {
            "reasoning_tokens": (
                out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
            )
        },
    }


def _error(error: Any) -> tuple[str, str]:
    """(error_type, message) of a Responses API error object (`code`, `message`)."""
    if not isinstance(error, dict):
        return "response_failed", short(str(error))
    code = error.get("code")
    http = isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600
    return f"http_{code}" if http else "response_failed", short(str(error.get("message") or code))


def measured(seen: Seen, t0: float, t_end: float, start_ns: int) -> dict[str, Any]:
    """The row's usage, cache, timing and clock columns from what was seen between `t0` (the
    perf_counter at submission, `start_ns` on the wall clock) and `t_end`."""
    usage = seen.usage or {}
    prompt_tokens = usage.get("prompt_tokens")
    output_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    out_details = usage.get("completion_tokens_details")
    reasoning = out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
    new_prefill, ratio = derived_cache(prompt_tokens, cached)
    first, last = seen.first_token, seen.last_token
    tpot = None
    if first is not None and last is not None and (output_tokens or 0) > 1:
        tpot = (last - first) * 1000 / (output_tokens - 1)
    return {
        "timestamp": datetime.fromtimestamp(start_ns / 1e9, UTC).isoformat(),
        "sglang_response_id": seen.response_id,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "reasoning_tokens": reasoning,
        "cached_tokens": cached,
        "new_prefill_tokens": new_prefill,
        "reported_cache_hit_ratio": ratio,
        "ttft_ms": None if first is None else (first - t0) * 1000,
        "tpot_ms": tpot,
        "e2e_ms": (t_end - t0) * 1000,
        "finish_reason": seen.finish_reason,
        "start_ns": start_ns,
        "end_ns": start_ns + int((t_end - t0) * 1e9),
    }


def dumps(value: Any) -> bytes:
    """A request body as the probe sends it: orjson (UTF-8, compact), json where orjson refuses
    (an int wider than 64 bits, NaN kept as NaN)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False).encode()


def failure(err: BaseException) -> tuple[str, str, str]:
    """(status, error_type, error_message) of a call that raised `err`."""
    if isinstance(err, (openai.APITimeoutError, *_lib_errors("TimeoutException"))):
        return STATUS_TIMEOUT, "timeout", short(str(err) or type(err).__name__)
    if isinstance(err, openai.APIStatusError):
        return STATUS_ERROR, f"http_{err.status_code}", short(err.message)
    if isinstance(err, (openai.APIConnectionError, *_lib_errors("TransportError"))):
        return STATUS_ERROR, "connection", short(str(err) or type(err).__name__)
    if isinstance(err, json.JSONDecodeError | ValueError | KeyError | TypeError):
        return STATUS_ERROR, "malformed_stream", short(f"{type(err).__name__}: {err}")
    return STATUS_ERROR, type(err).__name__, short(str(err))


def failure_named(types: list[str], message: str, status_code: int | None) -> tuple[str, str, str]:
    """`failure` of an exception known by its class names, most derived first (the lite probe
    records a call's failure so, in an interpreter without kvscope: probe/raw_call.py)."""
    named = set(types)
    first = types[0] if types else "Exception"
    if named & {"APITimeoutError", "TimeoutException"}:
        return STATUS_TIMEOUT, "timeout", short(message or first)
    if "APIStatusError" in named and isinstance(status_code, int):
        return STATUS_ERROR, f"http_{status_code}", short(message)
    if named & {"APIConnectionError", "TransportError"}:
        return STATUS_ERROR, "connection", short(message or first)
    if named & {"JSONDecodeError", "ValueError", "KeyError", "TypeError"}:
        return STATUS_ERROR, "malformed_stream", short(f"{first}: {message}")
    return STATUS_ERROR, first, short(message)


def short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
