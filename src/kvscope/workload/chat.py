"""The apps' one way to call the model: a streamed chat completion with the OpenAI SDK."""

from dataclasses import dataclass
from typing import Any

import openai


@dataclass(frozen=True)
class Reply:
    """One model call's outcome: its text, or why there is none."""

    content: str | None  # None when the call failed
    error_type: str | None = None


async def stream_chat(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    extra: dict[str, Any] | None = None,
) -> Reply:
    """One streamed chat completion at temperature 0 (`extra`: more create() arguments); a failed
    call, a malformed stream or one without its usage chunk is a Reply without content."""
    parts: list[str] = []
    usage = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            **(extra or {}),
        )
        async for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
            usage = chunk.usage or usage
    except (openai.APIError, ValueError) as err:  # ValueError: a malformed stream
        return Reply(None, type(err).__name__)
    if usage is None:
        return Reply(None, "incomplete_stream")
    return Reply("".join(parts))
