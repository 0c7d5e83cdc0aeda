"""`kvscope replay SOURCE --live`: send a source's calls to a real engine, as a kvscope run.

The replay is a profiled run (profiling.Profile: the engine started, reused or attached to with
a cold cache, /metrics, KV events, the request table, analysis, report.html, MLflow): every call
is sent with the OpenAI SDK inside it, as a streamed /v1/completions request whose prompt is the
call's token ids (a chat completion of its recorded messages where there are no ids),
`max_tokens` its recorded output tokens and `ignore_eos` so that the engine decodes exactly
that many, tagged with the call's original agent, workflow, previous agent and
turn (probe.identity.given). When each call is sent is live/pacing.py's business.

run.json gets `replay_of` (the source), `replay` (pacing, cold prompts, calls) and the MLflow
run the same as params. On a run directory the offline simulator's prediction for the replay
engine's capacity (the engine's own policy) is written beside the measurement, per agent, in
RUN/live_replay.json (`LIVE_REPLAY_JSON`), with the source's measured numbers.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from kvscope.capture import Hooks
from kvscope.config import EngineConfig, ExperimentConfig
from kvscope.errors import KvscopeError
from kvscope.live.calls import LiveCall
from kvscope.live.pacing import Timing, fire_time
from kvscope.probe.identity import CallIdentity, given
from kvscope.probe.tracing import truncate_param
from kvscope.records.run_dir import RUN_JSON, read_run_json

LIVE_REPLAY_JSON = "live_replay.json"
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


def engine_for(
    run_dir: Path | None, engine: Path | None, attach: str | None, capacity: int | None
) -> str | Path | EngineConfig | None:
    """The replay's engine: `attach`, the `engine` YAML, else the source run's own engine (on
    free ports), else the embedded one; `capacity` replaces the KV capacity of a launched one."""
    if attach is not None:
        if capacity is not None:
            raise KvscopeError("--capacity-tokens cannot change an attached engine's capacity")
        return None
    if engine is not None and capacity is None:
        return engine
    if engine is not None:
        from kvscope.config import load_yaml, parse_engine

        data = load_yaml(engine)
        base = parse_engine(data.get("engine", data), str(engine))
    elif run_dir is not None:
        recorded = (read_run_json(run_dir).get("config") or {}).get("engine") or {}
        if recorded.get("kind") == "attach":
            raise KvscopeError(
                f"{run_dir} ran on an attached engine: say which with --attach or --engine"
            )
        base = EngineConfig.model_validate(recorded)
        base = base.model_copy(update=_free_ports())
    else:
        base = EngineConfig()
    return base.model_copy(update={"kv_capacity_tokens": capacity}) if capacity else base


def _free_ports() -> dict[str, int]:
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return {"port": ports[0], "kv_events_port": ports[1]}


def run_live(
    cfg: ExperimentConfig,
    source_path: Path,
    calls: list[LiveCall],
    timings: list[Timing],
    settings: dict[str, Any],
    hooks: Hooks,
) -> tuple[Any, list[Sent]]:
    """Profile the replay: (profiling.Profile's outcome, what was sent)."""
    from kvscope.profiling import Profile

    prof = Profile(cfg, hooks)
    sent: list[Sent] = []
    with prof:
        _mark(prof, source_path, settings)
        hooks.on_stage(f"replaying {len(calls)} calls ({settings['pacing']} pacing)")
        key = os.environ.get("OPENAI_API_KEY") or "EMPTY"

        async def go() -> list[Sent]:
            async with openai.AsyncOpenAI(
                base_url=prof.base_url, api_key=key, max_retries=0, timeout=REQUEST_TIMEOUT_S
            ) as client:
                return await send_calls(client, prof.model, calls, timings, lambda _: None)

        t0 = time.monotonic()
        sent = asyncio.run(go())
        hooks.on_stage(f"replayed in {time.monotonic() - t0:.1f} s")
    return prof.outcome, sent


def _mark(prof: Any, source_path: Path, settings: dict[str, Any]) -> None:
    """run.json's replay_of / replay, and the same as MLflow params, while the run is open."""
    run_dir = prof.run_dir
    info = read_run_json(run_dir)
    info["replay_of"] = str(source_path)
    info["replay"] = settings
    (run_dir / RUN_JSON).write_text(json.dumps(info, indent=2, default=str))
    tracking = prof.session.tracking
    if tracking is not None and tracking.run_id is not None:
        params = {"replay_of": str(source_path)} | {f"replay_{k}": v for k, v in settings.items()}
        for k, v in params.items():
            tracking.client.log_param(tracking.run_id, k, truncate_param(str(v)))
