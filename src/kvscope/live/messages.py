"""A live replay's calls from a run's recorded chat messages, where it has no prompt token ids.

A run made with `store_prompts: true` (workload or app) keeps each chat call's messages in
`raw_messages_json`; without Level 3 prompt token ids (prompt_tokens.jsonl) those are what a
live replay can send: the same messages to /v1/chat/completions, which the engine's chat
template turns into the same prompt. Calls are the successful rows, in the order they started
(start_ns; the engine's scheduling cannot be read without token ids). A call without stored
messages (a completions call, or store_prompts off) cannot be replayed: with none at all this is
a KvscopeError saying so; some: they are left out and counted.

`cold=True` puts a system message unique to the call first (its first block differs, so no
prefix is shared with any other call); the prompt is that much longer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvscope.errors import KvscopeError
from kvscope.live.calls import LiveCall
from kvscope.records.requests import STATUS_OK
from kvscope.records.run_dir import RunDir


def message_calls(run: RunDir | Path, *, cold: bool = False) -> tuple[list[LiveCall], int]:
    """(the calls to send, how many successful calls had no stored messages)."""
    run = RunDir.open(run)
    run_dir = run.path
    rows = [
        r
        for r in run.requests.to_pylist()
        if r.get("status") == STATUS_OK and r.get("start_ns") is not None
    ]
    rows.sort(key=lambda r: (r["start_ns"], r.get("end_ns") or 0))
    usable = [r for r in rows if r.get("raw_messages_json")]
    if not usable:
        raise KvscopeError(
            f"{run_dir} has neither prompt token ids nor stored messages "
            "(raw_messages_json: run it with store_prompts: true): nothing to replay live"
        )
    calls = []
    for i, r in enumerate(usable):
        messages = _messages(run_dir, r)
        if cold:
            unique = {"role": "system", "content": f"[kvscope cold replay: call {i}]"}
            messages = (unique, *messages)
        start = r["start_ns"] / 1e9
        calls.append(
            LiveCall(
                index=i,
                request_id=r["request_uuid"],
                prompt_ids=(),
                max_tokens=max(int(r.get("output_tokens") or 0), 1),
                agent=r.get("agent_id"),
                workflow=r.get("workflow_run_id"),
                previous_agent=r.get("previous_agent_id"),
                turn=r.get("turn_id"),
                start_s=start,
                end_s=max((r.get("end_ns") or r["start_ns"]) / 1e9, start),
                recorded_cached=None if r.get("cached_tokens") is None else r["cached_tokens"],
                messages=messages,
                recorded_prompt=r.get("prompt_tokens"),
            )
        )
    return calls, len(rows) - len(usable)


def _messages(run_dir: Path, row: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    try:
        messages = json.loads(row["raw_messages_json"])
    except json.JSONDecodeError:
        raise KvscopeError(
            f"{run_dir}: request {row['request_uuid']}: raw_messages_json is not JSON"
        ) from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise KvscopeError(
            f"{run_dir}: request {row['request_uuid']}: raw_messages_json is not a message list"
        )
    return tuple(messages)
