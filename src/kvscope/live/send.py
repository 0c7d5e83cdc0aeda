"""Sending a live replay's calls: each at the time its Timing says (live/pacing.py), as one
streamed completion of its exact prompt token ids (a chat completion of its recorded messages
where it has no ids), `max_tokens` its recorded output and `ignore_eos` so the engine decodes
exactly that many, tagged with the call's original identity (probe.identity.given) so that the
capture names its row as the source named it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

from kvscope.live.calls import LiveCall
from kvscope.live.pacing import Timing, fire_time
from kvscope.probe.identity import CallIdentity, given

REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Sent:
    """What happened to one sent call (the row itself is the capture's)."""

    index: int
    sent_s: float  # seconds after the replay began
    done_s: float
    error_type: str | None


async def send_calls(
    client: openai.AsyncOpenAI,
    model: str,
    calls: list[LiveCall],
    timings: list[Timing],
    on_done: Callable[[Sent], None] = lambda _: None,
) -> list[Sent]:
    """Send every call when its Timing says (a failed call still completes: its successors go
    on); the result in index order."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    done: dict[int, asyncio.Event] = {c.index: asyncio.Event() for c in calls}
    completed: dict[int, float] = {}
    out: dict[int, Sent] = {}

    async def one(call: LiveCall, timing: Timing) -> None:
        for j, _ in timing.after:
            await done[j].wait()
        delay = fire_time(timing, began, completed) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = loop.time()
        with given(identity_of(call)):
            error = await complete(client, model, call)
        completed[call.index] = loop.time()
        out[call.index] = Sent(call.index, sent - began, completed[call.index] - began, error)
        done[call.index].set()
        on_done(out[call.index])

    async with asyncio.TaskGroup() as group:
        for call, timing in zip(calls, timings, strict=True):
            group.create_task(one(call, timing))
    return [out[c.index] for c in calls]


def identity_of(call: LiveCall) -> CallIdentity:
    """The row identity of a replayed call: its original agent, workflow and transition."""
    return CallIdentity(
        agent_id=call.agent,
        graph_node=call.agent,
        thread_id=call.workflow,
        workflow_run_id=call.workflow,
        turn_id=call.turn,
        previous_agent_id=call.previous_agent,
    )


async def complete(client: openai.AsyncOpenAI, model: str, call: LiveCall) -> str | None:
    """One streamed token-id completion (a chat completion of the recorded messages, for a call
    that has them); the error type of a failed one (the capture writes its row either way)."""
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": call.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": {"ignore_eos": True},
    }
    try:
        if call.messages is not None:
            chat = await client.chat.completions.create(messages=list(call.messages), **common)
            async for _ in chat:
                pass
        else:
            stream = await client.completions.create(prompt=list(call.prompt_ids), **common)
            async for _ in stream:
                pass
    except (openai.APIError, ValueError) as err:
        return type(err).__name__
    return None
