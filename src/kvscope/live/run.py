"""`kvscope replay SOURCE --live`: send a source's calls to a real engine, as a kvscope run.

    replayed = replay_live(path, LiveSettings(pacing="session"), hooks=hooks)
    replayed.document                       # RUN/live_replay.json: source vs replay vs prediction

The replay is one run of the pipeline (pipeline.py: the engine started, reused or attached to
with a cold cache, /metrics, KV events, the request table, analysis, report.html, MLflow) whose
driver sends the calls (live/send.py) with every call intercepted. Which calls: live/calls.py
(a run's prompt token ids, or a trace's), or live/messages.py (a run's recorded chat messages,
where it has no ids); when: live/pacing.py.

run.json gets `replay_of` (the source) and `replay` (the settings), the MLflow run the same as
params. RUN/live_replay.json (`LIVE_REPLAY_JSON`, live/compare.py) holds, per agent, the
source's measured numbers, the replay's, and the offline simulator's prediction for the replay
engine's capacity (the engine's own policy); it is logged to the run's MLflow run.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from kvscope import pipeline
from kvscope.capture import CaptureSession, Hooks
from kvscope.config import EngineConfig
from kvscope.engines import auth
from kvscope.engines.process import free_port_range
from kvscope.errors import KvscopeError
from kvscope.live.calls import LiveCall
from kvscope.live.pacing import Timing
from kvscope.live.send import REQUEST_TIMEOUT_S, send_calls
from kvscope.publish import RunOutcome, WorkloadOutcome
from kvscope.records.run_dir import RUN_JSON, RunDir, read_run_json

LIVE_REPLAY_JSON = "live_replay.json"


@dataclass(frozen=True)
class LiveSettings:
    """What `kvscope replay --live` was asked for (besides the source)."""

    block_size: int | None = None  # a trace's tokens per block (a run: its engine's)
    engine: Path | None = None  # an engine YAML; None: the source run's own engine
    attach: str | None = None  # the base URL of a running engine
    pacing: str = "session"  # live/pacing.py
    cold_prompts: bool = False  # a unique first block per call (no reuse)
    capacity_tokens: int | None = None  # the replay engine's KV capacity
    limit_workflows: int | None = None  # only the first N workflows
    runs_dir: Path | None = None
    tracking_uri: str | None = None


@dataclass(frozen=True)
class LiveReplay:
    """A finished live replay: its run, its document (live_replay.json) and what was left out."""

    outcome: RunOutcome
    document: dict[str, Any]
    skipped: int = 0  # calls without token ids or stored messages
    notes: list[str] = field(default_factory=list)  # what could not be done (MLflow logging)


def replay_live(
    source_path: Path, settings: LiveSettings, hooks: Hooks | None = None
) -> LiveReplay:
    """Replay SOURCE's calls live as a kvscope run; see the module docstring."""
    from kvscope.live.calls import limit_workflows, live_calls
    from kvscope.live.compare import live_document, predicted
    from kvscope.live.pacing import check_pacing, schedule
    from kvscope.profiling import profile_config
    from kvscope.sim.inputs.sources import Source, load_source

    hooks = hooks or Hooks()
    check_pacing(settings.pacing)
    if settings.engine is not None and settings.attach is not None:
        raise KvscopeError("--live: give --engine or --attach, not both")
    source: Source | None = None
    skipped = 0
    run = RunDir.open(source_path) if source_path.is_dir() else None  # read once, used by all
    if run is not None and not run.has_tokens:
        from kvscope.live.messages import message_calls

        every, skipped = message_calls(run, cold=settings.cold_prompts)
    else:
        source = load_source(run or source_path, settings.block_size)
        every = live_calls(source, source_path, cold=settings.cold_prompts)
    calls = limit_workflows(every, settings.limit_workflows)
    timings = schedule(settings.pacing, [c.workflow for c in calls],
                       [c.start_s for c in calls], [c.end_s for c in calls])  # fmt: skip
    engine = engine_for(run, settings.engine, settings.attach, settings.capacity_tokens)
    cfg = profile_config(
        f"replay-{_source_name(source_path)}", engine, settings.attach,
        runs_dir=settings.runs_dir, tracking_uri=settings.tracking_uri,
    )  # fmt: skip
    recorded = {
        "source": str(source_path.resolve()),
        "source_kind": source.kind if source is not None else "run (messages)",
        "source_run_id": run.info.get("benchmark_run_id") if run is not None else None,
        "pacing": settings.pacing,
        "cold_prompts": settings.cold_prompts,
        "calls": len(calls),
        "limit_workflows": settings.limit_workflows,
    }

    def drive(session: CaptureSession) -> WorkloadOutcome:
        _mark(session, source_path.resolve(), recorded)
        hooks.on_stage(f"replaying {len(calls)} calls ({settings.pacing} pacing)")
        t0 = time.monotonic()
        with session.intercept():
            asyncio.run(_send(session, calls, timings))
        hooks.on_stage(f"replayed in {time.monotonic() - t0:.1f} s")
        return WorkloadOutcome()

    outcome = pipeline.run(cfg, drive, hooks)
    analysis = outcome.analysis
    harmful = None
    if analysis.blocks is not None:
        from kvscope.analysis.evictions import summary as eviction_summary

        harmful = eviction_summary(analysis.blocks)["harmful_evictions"]
    prediction = (
        predicted(source, calls, analysis.kv_capacity)
        if source is not None and not settings.cold_prompts
        else {}
    )
    doc = live_document(calls, recorded, analysis.requests, prediction, harmful)
    path = analysis.run_dir / LIVE_REPLAY_JSON
    path.write_text(json.dumps(doc, indent=2))
    return LiveReplay(outcome, doc, skipped, _log(outcome, path))


async def _send(session: CaptureSession, calls: list[LiveCall], timings: list[Timing]) -> None:
    assert session.base_url is not None and session.model is not None
    key = auth.api_key(session.cfg.engine.api_key_env) or os.environ.get("OPENAI_API_KEY")
    async with openai.AsyncOpenAI(
        base_url=session.base_url, api_key=key or "EMPTY", max_retries=0,
        timeout=REQUEST_TIMEOUT_S,
    ) as client:  # fmt: skip
        await send_calls(client, session.model, calls, timings)


def _log(outcome: RunOutcome, path: Path) -> list[str]:
    """Add live_replay.json to the run's MLflow run; why it could not be, if it could not."""
    if not (outcome.mlflow_run_id and outcome.tracking_uri):
        return []
    try:
        from mlflow import MlflowClient

        MlflowClient(outcome.tracking_uri).log_artifact(outcome.mlflow_run_id, str(path))
    except Exception as err:
        return [f"{path.name} not logged to MLflow: {err}"]
    return []


def engine_for(
    run: RunDir | None, engine: Path | None, attach: str | None, capacity: int | None
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
    elif run is not None:
        recorded = (run.info.get("config") or {}).get("engine") or {}
        if recorded.get("kind") == "attach":
            raise KvscopeError(
                f"{run.path} ran on an attached engine: say which with --attach or --engine"
            )
        base = EngineConfig.model_validate(recorded)
        base = base.model_copy(update=_free_ports())
    else:
        base = EngineConfig()
    return base.model_copy(update={"kv_capacity_tokens": capacity}) if capacity else base


def _free_ports() -> dict[str, int]:
    return {"port": free_port_range(), "kv_events_port": free_port_range(2)}


def _mark(session: CaptureSession, source_path: Path, settings: dict[str, Any]) -> None:
    """run.json's replay_of / replay, and the same as MLflow params, while the run is open."""
    run_dir = session.run_dir
    info = read_run_json(run_dir)
    info["replay_of"] = str(source_path)
    info["replay"] = settings
    (run_dir / RUN_JSON).write_text(json.dumps(info, indent=2, default=str))
    session.log_params(
        {"replay_of": str(source_path)} | {f"replay_{k}": v for k, v in settings.items()}
    )


def _source_name(path: Path) -> str:
    return (path.name if path.is_dir() else path.stem) or "source"
