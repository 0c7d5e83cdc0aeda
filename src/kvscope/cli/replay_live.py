"""`kvscope replay SOURCE --live`: the CLI side of live/run.py (a profiled run that sends
SOURCE's calls to a real engine), its summary and RUN/live_replay.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvscope.cli.common import console
from kvscope.errors import KvscopeError
from kvscope.records.tokens import has_tokens

if TYPE_CHECKING:
    from kvscope.sim.inputs.sources import Source


def replay_live(
    source_path: Path,
    block_size: int | None,
    *,
    engine: Path | None,
    attach: str | None,
    pacing: str,
    cold_prompts: bool,
    capacity_tokens: str | None,
    limit_workflows: int | None,
    runs_dir: Path | None,
    tracking_uri: str | None,
) -> Path:
    """Replay SOURCE live; print the per-agent comparison; the replay's run directory."""
    from kvscope.capture import Hooks
    from kvscope.live.calls import limit_workflows as limit
    from kvscope.live.calls import live_calls
    from kvscope.live.compare import live_document, predicted, summary_lines
    from kvscope.live.pacing import check_pacing, schedule
    from kvscope.live.run import LIVE_REPLAY_JSON, engine_for, run_live
    from kvscope.sim.inputs.sources import load_source

    check_pacing(pacing)
    if engine is not None and attach is not None:
        raise KvscopeError("--live: give --engine or --attach, not both")
    capacity = _one_capacity(capacity_tokens)
    source: Source | None = None
    if source_path.is_dir() and not has_tokens(source_path):
        from kvscope.live.messages import message_calls

        every, skipped = message_calls(source_path, cold=cold_prompts)
        if skipped:
            console.print(f"left out: {skipped} calls without stored messages", highlight=False)
        run_dir: Path | None = source_path
    else:
        source = load_source(source_path, block_size)
        every, run_dir = live_calls(source, source_path, cold=cold_prompts), source.run_dir
    calls = limit(every, limit_workflows)
    timings = schedule(
        pacing, [c.workflow for c in calls], [c.start_s for c in calls], [c.end_s for c in calls]
    )
    from kvscope.profiling import profile_config

    name = f"replay-{_source_name(source_path)}"
    cfg = profile_config(
        name,
        engine_for(run_dir, engine, attach, capacity),
        attach,
        runs_dir=runs_dir,
        tracking_uri=tracking_uri,
    )
    settings: dict[str, Any] = {
        "source": str(source_path.resolve()),
        "source_kind": source.kind if source is not None else "run (messages)",
        "source_run_id": _source_run_id(run_dir),
        "pacing": pacing,
        "cold_prompts": cold_prompts,
        "calls": len(calls),
        "limit_workflows": limit_workflows,
    }

    def stage(text: str) -> None:
        console.print(f"[dim]{text}[/dim]")

    outcome, _ = run_live(cfg, source_path.resolve(), calls, timings, settings, Hooks(stage))
    analysis = outcome.analysis
    replay_capacity = analysis.kv_capacity
    harmful = None
    if analysis.blocks is not None:
        from kvscope.analysis.evictions import summary as eviction_summary

        harmful = eviction_summary(analysis.blocks)["harmful_evictions"]
    prediction = (
        predicted(source, calls, replay_capacity) if source is not None and not cold_prompts else {}
    )
    doc = live_document(calls, settings, analysis.requests, prediction, harmful)
    path = analysis.run_dir / LIVE_REPLAY_JSON
    path.write_text(json.dumps(doc, indent=2))
    if outcome.mlflow_run_id and outcome.tracking_uri:
        try:
            from mlflow import MlflowClient

            MlflowClient(outcome.tracking_uri).log_artifact(outcome.mlflow_run_id, str(path))
        except Exception as err:
            console.print(f"live_replay.json not logged to MLflow: {err}", highlight=False)
    for line in summary_lines(doc):
        console.print(line, highlight=False)
    console.print(f"run: {analysis.run_dir}", highlight=False)
    console.print(f"compare: kvscope compare {_original(source_path)} {analysis.run_dir}")
    return analysis.run_dir


def _one_capacity(text: str | None) -> int | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) != 1:
        raise KvscopeError("--live takes one --capacity-tokens (the replay engine's capacity)")
    try:
        return int(parts[0].replace("_", ""))
    except ValueError:
        raise KvscopeError(f"--capacity-tokens takes an integer, got {parts[0]!r}") from None


def _source_name(path: Path) -> str:
    return (path.name if path.is_dir() else path.stem) or "source"


def _source_run_id(run_dir: Path | None) -> str | None:
    if run_dir is None:
        return None
    from kvscope.records.run_dir import read_run_json

    return read_run_json(run_dir).get("benchmark_run_id")


def _original(path: Path) -> str:
    return str(path) if path.is_dir() else "ORIGINAL"
