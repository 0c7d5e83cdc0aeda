"""`kvscope replay SOURCE --live`: the CLI side of live/run.py (a kvscope run that sends
SOURCE's calls to a real engine): parse the options, print the per-agent comparison."""

from __future__ import annotations

from pathlib import Path

from kvscope.cli.common import console
from kvscope.errors import KvscopeError


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
    from kvscope.live.compare import summary_lines
    from kvscope.live.run import LiveSettings
    from kvscope.live.run import replay_live as run_replay

    settings = LiveSettings(
        block_size=block_size, engine=engine, attach=attach, pacing=pacing,
        cold_prompts=cold_prompts, capacity_tokens=_one_capacity(capacity_tokens),
        limit_workflows=limit_workflows, runs_dir=runs_dir, tracking_uri=tracking_uri,
    )  # fmt: skip

    def stage(text: str) -> None:
        console.print(f"[dim]{text}[/dim]")

    replayed = run_replay(source_path, settings, Hooks(stage))
    if replayed.skipped:
        console.print(
            f"left out: {replayed.skipped} calls without stored messages", highlight=False
        )
    for line in [*replayed.notes, *summary_lines(replayed.document)]:
        console.print(line, highlight=False)
    run_dir = replayed.outcome.analysis.run_dir
    console.print(f"run: {run_dir}", highlight=False)
    original = str(source_path) if source_path.is_dir() else "ORIGINAL"
    console.print(f"compare: kvscope compare {original} {run_dir}")
    return run_dir


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
