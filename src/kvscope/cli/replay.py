"""`kvscope replay SOURCE`: replay a run's (or a trace's) requests through a prefix-cache
simulator under other eviction policies and capacities, and say what each would have cached.

SOURCE is a kvscope run directory (Level 3 prompt token ids needed), a Mooncake trace or a
token-id trace (JSONL; see kvscope.sim.inputs.sources). Printed: per policy x capacity the
token-weighted hit ratio overall, per agent and per transition, recompute tokens, harmful
evictions (evictor agent -> victim agent) and the TTFT the policy would save (from the run's
fitted prefill cost per token; null when none could be fitted); on a run directory also the
fidelity of the replay under the engine's own policy at the run's capacity. On a run directory
the results are written as RUN/replay.json and RUN/replay.png (the report shows them) and logged
to the run's MLflow run when it has one. `--to-mooncake` / `--to-tokens` also write the replayed
requests in the two trace formats (replaying those gives the same results). `--host-tokens`
adds a host tier below every capacity (`--host-load-ms` per block loaded, `--prefetch` KVFlow's
prefetch): the output then splits device hits, host hits and misses per agent.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvscope.cli.common import console, friendly
from kvscope.cli.report import TRACKING_OPTION, mlflow_run_of
from kvscope.errors import KvscopeError

if TYPE_CHECKING:
    from kvscope.sim.inputs.sources import Source

PROGRESS_AFTER = 2_000  # requests x replays above which a progress bar is shown


def _fit(source: Source) -> dict[str, Any] | None:
    """The run's fitted prefill cost (analysis.latency.fit_prefill_cost) as a dict, or None."""
    if source.run_dir is None:
        return None
    from kvscope.analysis.latency import fit_prefill_cost
    from kvscope.records import requests

    fit = fit_prefill_cost(requests.load_table(source.run_dir))
    return None if fit is None else asdict(fit)


def replay_document(
    source: Source,
    source_path: Path,
    policy: str | None,
    capacity_tokens: str | None,
    tier: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every policy x capacity over the loaded SOURCE (with a progress bar when long): the
    document that replay.json holds (report.replay_section describes it). `tier`: make_plan's
    host_tokens / prefetch / load_ms_per_block."""
    from kvscope.sim.plan import make_plan, run_plan, split_list

    plan = make_plan(source, split_list(policy), split_list(capacity_tokens), **(tier or {}))
    fit = _fit(source)
    steps = len(plan.policies) * len(plan.capacities)
    show = console.is_terminal and len(source.trace) * steps > PROGRESS_AFTER
    columns = (
        TextColumn("replay {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True, disable=not show) as bar:
        task = bar.add_task("", total=steps)
        outcome = run_plan(
            source,
            plan,
            fit["ms_per_token"] if fit else None,
            lambda p, c: bar.update(task, advance=1, description=f"{p} @ {c:,}"),
        )
    notes = [*source.notes, *plan.notes]
    notes += [f"left out: {n} calls ({why})" for why, n in source.excluded.items()]
    return {
        "source": str(source_path),
        "kind": source.kind,
        "block_size": source.trace.block_size,
        "requests": len(source.trace),
        "engine_policy": source.policy,
        "run_capacity_tokens": source.trace.capacity_tokens,
        "host_tokens": plan.host_blocks * source.trace.block_size or None,
        "prefetch": plan.prefetch,
        "fit": fit,
        "notes": notes,
        "fidelity": None if outcome.fidelity is None else outcome.fidelity.to_dict(),
        "results": [s.to_dict() for s in outcome.summaries],
    }


def _export(source: Source, to_mooncake: Path | None, to_tokens: Path | None) -> None:
    """SOURCE's replayed requests as a Mooncake and/or a token-id trace (sim.inputs.convert)."""
    from kvscope.sim.inputs.convert import mooncake_rows, token_rows, write_jsonl

    for path, rows in ((to_mooncake, mooncake_rows), (to_tokens, token_rows)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(rows(source), path)
            console.print(f"written: {path}", highlight=False)


def _write_run_files(run_dir: Path, doc: dict[str, Any], no_mlflow: bool, uri: str | None) -> None:
    from kvscope.records.run_dir import REPLAY_JSON, REPLAY_PNG
    from kvscope.report import plots
    from kvscope.report.replay_section import replay_plot

    files = [run_dir / REPLAY_JSON]
    files[0].write_text(json.dumps(doc, indent=2))
    if png := plots.write_png(
        replay_plot(doc["results"], doc["run_capacity_tokens"]), run_dir / REPLAY_PNG
    ):
        files.append(png)
    console.print(f"written: {', '.join(str(f) for f in files)}", highlight=False)
    if no_mlflow:
        return
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    try:
        client, run_id = mlflow_run_of(run_dir, uri)
    except KvscopeError as err:
        console.print(f"not logged to MLflow: {err}", highlight=False)
        return
    for f in files:
        client.log_artifact(run_id, str(f))
    console.print(f"logged to MLflow run {run_id}")


@friendly
def replay(
    source: Annotated[
        Path, typer.Argument(help="A run directory, a Mooncake trace or a token-id trace.")
    ],
    policy: Annotated[
        str | None,
        typer.Option(
            help="Policies, comma-separated (default: the engine's own, "
            "steps-to-execution, predicted-next-agent, belady)."
        ),
    ] = None,
    capacity_tokens: Annotated[
        str | None,
        typer.Option(help="KV capacities in tokens, comma-separated (default: the run's)."),
    ] = None,
    block_size: Annotated[
        int | None,
        typer.Option(help="Tokens per block (traces: required; a run: its engine's)."),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Write the results as a JSON list (one per policy x capacity)."
        ),
    ] = None,
    no_write: Annotated[
        bool, typer.Option("--no-write", help="Do not write replay.json/.png into the run.")
    ] = False,
    no_mlflow: Annotated[
        bool, typer.Option("--no-mlflow", help="Do not log to the run's MLflow run.")
    ] = False,
    to_mooncake: Annotated[
        Path | None,
        typer.Option(help="Also write the replayed requests as a Mooncake trace (JSONL)."),
    ] = None,
    to_tokens: Annotated[
        Path | None,
        typer.Option(help="Also write them as a token-id trace (JSONL; run directories only)."),
    ] = None,
    host_tokens: Annotated[
        int | None,
        typer.Option(help="A host tier of this many tokens below the device (vLLM semantics)."),
    ] = None,
    host_load_ms: Annotated[
        float | None,
        typer.Option(help="What loading one block from the host tier costs, in ms."),
    ] = None,
    prefetch: Annotated[
        bool,
        typer.Option(
            "--prefetch", help="KVFlow prefetch: the next agent's host blocks load before its call."
        ),
    ] = False,
    tracking_uri: Annotated[str | None, TRACKING_OPTION] = None,
    live: Annotated[
        bool,
        typer.Option(
            "--live",
            help="Send the calls to a real engine instead (a kvscope run; kvscope.live.calls).",
        ),
    ] = False,
    engine: Annotated[
        Path | None,
        typer.Option(help="--live: the engine config YAML (default: the source run's engine)."),
    ] = None,
    attach: Annotated[
        str | None, typer.Option(help="--live: the base URL of a running engine to replay on.")
    ] = None,
    pacing: Annotated[
        str,
        typer.Option(
            help="--live: session (a workflow's next call after its previous one completes plus "
            "the recorded gap) or open-loop (every call at its recorded offset)."
        ),
    ] = "session",
    cold_prompts: Annotated[
        bool,
        typer.Option("--cold-prompts", help="--live: a unique first block per call (no reuse)."),
    ] = False,
    limit_workflows: Annotated[
        int | None, typer.Option(help="--live: replay only the first N workflows.")
    ] = None,
    runs_dir: Annotated[
        Path | None, typer.Option(help="--live: where the replay run is written.")
    ] = None,
) -> None:
    """Replay SOURCE's requests under other eviction policies and KV capacities (or, with
    --live, on a real engine, as a kvscope run)."""
    if live:
        from kvscope.cli.replay_live import replay_live

        replay_live(
            source, block_size, engine=engine, attach=attach, pacing=pacing,
            cold_prompts=cold_prompts, capacity_tokens=capacity_tokens,
            limit_workflows=limit_workflows, runs_dir=runs_dir, tracking_uri=tracking_uri,
        )  # fmt: skip
        return
    live_only = {"--engine": engine, "--attach": attach, "--limit-workflows": limit_workflows,
                 "--runs-dir": runs_dir}  # fmt: skip
    if (
        given := [k for k, v in live_only.items() if v is not None]
        + (["--cold-prompts"] if cold_prompts else [])
        + (["--pacing"] if pacing != "session" else [])
    ):
        raise KvscopeError(f"{', '.join(given)}: only with --live")
    from kvscope.report.replay_section import replay_sections
    from kvscope.report.terminal import print_section

    if not console.is_terminal:
        console.width = max(console.width, 160)
    from kvscope.sim.inputs.sources import load_source

    loaded = load_source(source, block_size)
    if to_tokens is not None and loaded.run_dir is None:
        raise KvscopeError("--to-tokens needs a run directory (its prompt token ids)")
    tier = {"host_tokens": host_tokens, "prefetch": prefetch, "load_ms_per_block": host_load_ms}
    doc = replay_document(loaded, source, policy, capacity_tokens, tier)
    for section in replay_sections(doc):
        print_section(console, section)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc["results"], indent=2))
        console.print(f"written: {json_out}", highlight=False)
    _export(loaded, to_mooncake, to_tokens)
    if doc["kind"] == "run" and not no_write:
        _write_run_files(source, doc, no_mlflow, tracking_uri)
