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
  `malformed_stream`, `incomplete_stream`.
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


def loads(data: bytes | str) -> Any:
    """JSON as the probe reads bodies and events: orjson, json where orjson refuses (NaN,
    Infinity); a ValueError (json.JSONDecodeError) for what neither reads."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


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


def short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
