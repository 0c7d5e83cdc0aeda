"""`kvscope replay SOURCE`: replay a run's (or a trace's) requests through a prefix-cache
simulator under other eviction policies and capacities, and say what each would have cached.

SOURCE is a kvscope run directory (Level 3 prompt token ids needed), a Mooncake trace or a
token-id trace (JSONL, plain or compressed; token ids also as Arrow or Parquet; see
kvscope.sim.inputs.sources). Printed: per policy x capacity the
token-weighted hit ratio overall, per agent and per transition, recompute tokens, harmful
evictions (evictor agent -> victim agent) and the TTFT the policy would save (from the run's
fitted prefill cost per token; null when none could be fitted); on a run directory also the
fidelity of the replay under the engine's own policy at the run's capacity. On a run directory
the results are written as RUN/replay.json and RUN/replay.png (the report shows them) and logged
to the run's MLflow run when it has one. `--to-mooncake` / `--to-tokens` also write the replayed
requests in the two trace formats (replaying those with --cache-outputs gives the same
results). `--cache-outputs / --prompt-only`: whether requests' output blocks take cache space
(default: the engine's own for a run directory, prompt-only for a trace); each result says which
(`caching`). `--in-request-order head-first` evicts a request's first block first, not its last
(vLLM semantics; each result's `in_request_order`). `--host-tokens` adds a host tier below every
capacity (`--host-load-ms` per block loaded, `--prefetch` KVFlow's prefetch): the output then
splits device hits, host hits and misses per agent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from kvscope.cli.common import console, friendly
from kvscope.cli.report import TRACKING_OPTION, logged
from kvscope.errors import KvscopeError
from kvscope.records import formats

if TYPE_CHECKING:
    from kvscope.sim.inputs.sources import Source

PROGRESS_AFTER = 2_000  # requests x replays above which a progress bar is shown


def replay_with_progress(
    source: Source, source_path: Path, policy: str | None, capacity_tokens: str | None,
    tier: dict[str, Any] | None = None, cache_outputs: bool | None = None,
    in_request: str | None = None, jobs: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """replaying.replay_document over every policy x capacity on `jobs` processes, with a
    progress bar (advanced as each cell finishes) when long."""
    from kvscope.replaying import plan_of, replay_document

    plan = plan_of(source, policy, capacity_tokens, tier, cache_outputs, in_request)
    steps = len(plan.policies) * len(plan.capacities)
    show = console.is_terminal and len(source.trace) * steps > PROGRESS_AFTER
    columns = (TextColumn("replay {task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True, disable=not show) as bar:
        task = bar.add_task("", total=steps)
        return replay_document(
            source, source_path, plan,
            lambda p, c: bar.update(task, advance=1, description=f"{p} @ {c:,}"), jobs,
        )  # fmt: skip


READ_BAR_FROM_BYTES = 8 << 20  # a JSONL trace this large (or compressed) shows a reading bar


@contextmanager
def reading_bar(source: Path) -> Iterator[None]:
    """A progress bar of the bytes of a JSONL trace read so far (sim/inputs/chunks.watching:
    of a compressed one, its text read so far, with no total), on a terminal, for a file large
    enough to take a while; a run directory or an Arrow trace shows none."""
    show = console.is_terminal and source.is_file() and not formats.is_arrow(source)
    packed = show and formats.compressed(source)
    size = source.stat().st_size if show else 0
    if not show or (size < READ_BAR_FROM_BYTES and not packed):
        yield
        return
    from kvscope.sim.inputs.chunks import watching

    name = f"reading {source.name}" + (" (its text)" if packed else "")
    columns = (TextColumn(name), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("", total=None if packed else size)
        with watching(lambda n: bar.advance(task, n)):
            yield


STREAM_FROM_BYTES = 32 << 20  # a trace file this large is replayed as it is read, where it can
# (a compressed one whatever its size: its text may be many times larger)


def streamed(
    source: Path, block_size: int | None, policy: str | None, capacity_tokens: str | None,
    cache_outputs: bool | None, in_request: str | None, notes: list[str],
) -> dict[str, Any] | None:  # fmt: skip
    """replaying.streamed_document where it applies: LRU at the capacities given, on a trace
    file of STREAM_FROM_BYTES or more or a compressed one (smaller ones replay faster whole,
    without compiled code); else None (the trace is read whole; `notes` says why where it was
    tried)."""
    if policy is None or [p.strip() for p in policy.split(",")] != ["lru"]:
        return None
    caps = [c.strip().replace("_", "") for c in (capacity_tokens or "").split(",")]
    if not all(c.isdigit() for c in caps):
        return None
    if not source.is_file():
        return None
    if source.stat().st_size < STREAM_FROM_BYTES and not formats.compressed(source):
        return None
    from kvscope.replaying import streamed_document

    caps_tokens = [int(c) for c in caps]
    with reading_bar(source):  # a streamed replay reads the trace as it replays it
        return streamed_document(source, block_size, caps_tokens, cache_outputs, in_request, notes)


@friendly
def replay(
    source: Annotated[
        Path,
        typer.Argument(
            help="A run directory, a Mooncake trace or a token-id trace (JSONL, .gz/.bz2/.xz, "
            "Arrow or Parquet)."
        ),
    ],
    policy: Annotated[
        str | None,
        typer.Option(
            help="Policies, comma-separated (default: the engine's own, "
            "steps-to-execution, predicted-next-agent, belady). SGLang's priority eviction: "
            "priority-hints (the priorities the calls carried), steps-to-execution-hints, "
            "predicted-next-hints (computed offline)."
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
        typer.Option(
            help="Also write them as a token-id trace (JSONL, or Arrow for a path ending in "
            ".arrow; run directories only)."
        ),
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
    cache_outputs: Annotated[
        bool | None,
        typer.Option(
            "--cache-outputs/--prompt-only",
            help="Whether a request's output blocks take cache space (the engine's block pool or "
            "radix tree) or the cache holds prompts' full blocks only. Default: the engine's own "
            "(--cache-outputs) for a run directory, --prompt-only for a trace.",
            show_default=False,
        ),
    ] = None,
    in_request_order: Annotated[
        str | None,
        typer.Option(
            help="Which of a request's blocks is evicted first: tail-first (the engines'; "
            "default) or head-first (its first block, as kvlint and prefixlens; vLLM "
            "semantics only)."
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            help="Processes the policy x capacity cells run on (default: the CPU count; 1: one "
            "after another in this process). Forked: each shares the loaded trace.",
            show_default=False,
        ),
    ] = None,
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

        if cache_outputs is not None or in_request_order is not None or jobs is not None:
            raise KvscopeError(
                "--cache-outputs / --prompt-only / --in-request-order / --jobs: not with --live "
                "(the engine caches as it does)"
            )

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
    from kvscope.replaying import export, write_replay
    from kvscope.sim.inputs.sources import load_source

    if jobs is not None and jobs < 1:
        raise KvscopeError(f"--jobs must be at least 1, got {jobs}")
    tier = {"host_tokens": host_tokens, "prefetch": prefetch, "load_ms_per_block": host_load_ms}
    plain = not (any(v for v in tier.values()) or to_mooncake or to_tokens)
    why: list[str] = []  # why a streamed replay gave way to a whole one
    doc = None
    if plain:
        doc = streamed(source, block_size, policy, capacity_tokens, cache_outputs,
                       in_request_order, why)  # fmt: skip
    if doc is None:
        from kvscope.sim.grid import default_jobs

        with reading_bar(source):
            loaded = load_source(source, block_size, need_capacity=capacity_tokens is None)
        if to_tokens is not None and loaded.run_dir is None:
            raise KvscopeError("--to-tokens needs a run directory (its prompt token ids)")
        doc = replay_with_progress(
            loaded, source, policy, capacity_tokens, tier, cache_outputs, in_request_order,
            jobs or default_jobs(),
        )  # fmt: skip
        doc["notes"] = [*why, *doc["notes"]]
    for section in replay_sections(doc):
        print_section(console, section)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc["results"], indent=2))
        console.print(f"written: {json_out}", highlight=False)
    if not plain:
        for path in export(loaded, to_mooncake, to_tokens):
            console.print(f"written: {path}", highlight=False)
    if doc["kind"] == "run" and not no_write:
        written = write_replay(source, doc)
        console.print(f"written: {', '.join(str(f) for f in written)}", highlight=False)
        if not no_mlflow:
            logged(source, written, tracking_uri)
