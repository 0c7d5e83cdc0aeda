"""`kvscope replay SOURCE` as functions: the simulator's results for a source, and the files
they are kept in. The CLI (cli/replay.py) parses, shows progress and prints; nothing else.

    source = load_source(path, block_size)                      # sim.inputs.sources
    doc = replay_document(source, path, "lru,belady", "4096")   # replay.json's document
    written = write_replay(source.run_dir, doc)                 # RUN/replay.json, RUN/replay.png
    exported = export(source, to_mooncake=..., to_tokens=...)   # the trace formats
"""

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.errors import KvscopeError
from kvscope.gc_paused import gc_paused
from kvscope.sim.inputs.sources import Source
from kvscope.sim.plan import Outcome, Plan, make_plan, order_note, run_plan, split_list
from kvscope.sim.results.summary import UNNAMED_HARM, names_anyone, summarize
from kvscope.sim.simulate import CACHING, IN_REQUEST


def fitted_cost(source: Source) -> dict[str, Any] | None:
    """The run's fitted prefill cost (analysis.latency.fit_prefill_cost) as a dict, or None."""
    if source.run is None:
        return None
    from kvscope.analysis.latency import fit_prefill_cost

    fit = fit_prefill_cost(source.run.requests)
    return None if fit is None else asdict(fit)


def plan_of(
    source: Source,
    policy: str | None,
    capacity_tokens: str | None,
    tier: dict[str, Any] | None,
    cache_outputs: bool | None = None,
    in_request: str | None = None,
) -> Plan:
    """Which policies at which capacities (comma-separated; None: the defaults). `tier`:
    make_plan's host_tokens / prefetch / load_ms_per_block. `cache_outputs`: whether the cache
    holds requests' output blocks (None: the engine's own, yes, for a run directory; prompt-only
    for an external trace, as the simulators it is compared with). `in_request`: which of a
    request's blocks is evicted first (None: the engine's, tail-first)."""
    if cache_outputs is None:
        cache_outputs = source.kind == "run"
    return make_plan(
        source,
        split_list(policy),
        split_list(capacity_tokens),
        **(tier or {}),
        cache_outputs=cache_outputs,
        in_request=in_request or IN_REQUEST[0],
    )


def replay_document(
    source: Source,
    source_path: Path,
    plan: Plan,
    on_step: Callable[[str, int], None] = lambda _p, _c: None,
    jobs: int = 1,
) -> dict[str, Any]:
    """Run every policy x capacity of `plan` over the loaded source: the document replay.json
    holds (report.replay_section describes it). `on_step(policy, capacity)` after each (in
    completion order when parallel). `jobs`: processes the cells run on (sim.grid: the same
    document whatever the number; 1 runs them here, one after another)."""
    fit = fitted_cost(source)
    outcome = run_plan(source, plan, fit["ms_per_token"] if fit else None, on_step, jobs)
    return _document(source, source_path, plan, fit, outcome)


def streamed_document(
    path: Path,
    block_size: int | None,
    capacities_tokens: Sequence[int],
    cache_outputs: bool | None = None,
    in_request: str | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any] | None:
    """`replay_document` of LRU on a trace file, replayed as it is read (the trace's keys are
    never all in memory): at one capacity by sim/streamed.py's resumable pool; at several, with
    prompt-only caching on a trace that names no agent, by sim/streamed_sweep.py's one pass
    over stack distances. None where it cannot be (requests out of start order; for several
    capacities, another caching, agents named, or what caches/stack.py would not answer in one
    pass): then the trace must be read whole, and `notes` is told why (for the whole replay's
    notes). With the garbage collector paused (gc_paused.py: the chunks' rows are many objects
    in no cycle)."""
    with gc_paused():
        doc, why = _streamed(path, block_size, capacities_tokens, cache_outputs, in_request)
    if why is not None and notes is not None:
        notes.append(f"replayed from the whole trace, not chunk by chunk as read: {why}")
    return doc


def _streamed(
    path: Path,
    block_size: int | None,
    capacities_tokens: Sequence[int],
    cache_outputs: bool | None,
    in_request: str | None,
) -> tuple[dict[str, Any] | None, str | None]:
    """(the document, None), or (None, why the trace cannot be replayed as it is read)."""
    from kvscope.sim.inputs.rows import KeyChunks, Rows
    from kvscope.sim.inputs.sources import trace_reads
    from kvscope.sim.streamed import CannotStream, stream_lru
    from kvscope.sim.streamed_sweep import stream_sweep

    read = trace_reads(path, block_size)
    bs = read.block_size
    for cap in capacities_tokens:  # make_plan's refusals, before the trace is read
        if cap < bs:
            raise KvscopeError(f"capacity {cap} tokens is less than one block of {bs}")
    blocks = sorted({cap // bs for cap in capacities_tokens})
    order = in_request or IN_REQUEST[0]
    order_note(order, None, ["lru"])
    cache = bool(cache_outputs)  # a trace's default: prompt-only
    chunks = iter(read.chunks)
    first = next(chunks, None)
    labels = [] if first is None else [*first[0].agents, *first[0].workflows]
    named = any(v is not None for v in labels)  # harm is reported by agent
    if len(blocks) > 1 and (cache or named):
        what = "requests name agents (harm is reported by agent)" if named else "outputs cached"
        return None, f"several capacities in one pass need prompt-only caching, no agents: {what}"
    reads = itertools.chain([first] if first else [], chunks)
    try:
        if len(blocks) == 1:
            result, columns = stream_lru(
                reads, bs, blocks[0], cache_outputs=cache, in_request=order, attribute=named
            )
            results = {blocks[0]: result}
        else:
            results, columns = stream_sweep(reads, bs, blocks, in_request=order)
    except CannotStream as err:
        return None, str(err)
    rows, keys = Rows(), KeyChunks()
    for c in columns:  # the requests without their keys: what the summary and notes need
        rows.add(c)
        keys.add_flat(np.zeros(0, dtype=np.uint64), np.zeros(len(c.ids), dtype=np.int64))
    source = Source(read.kind, rows.trace(path, bs, keys), notes=read.notes)
    plan = plan_of(source, "lru", ",".join(map(str, capacities_tokens)), None, cache, order)
    summaries = [
        replace(summarize(source.trace, results[cap // bs]), requested_capacity_tokens=cap)
        for cap in plan.capacities
    ]
    how = (
        f" at {len(blocks)} capacities in one pass over stack distances" if len(blocks) > 1 else ""
    )
    notes = [
        f"lru replayed{how} as the trace was read (its requests came in start order): its block "
        "keys were never all in memory; seconds include the reading"
    ]
    return _document(source, path, plan, None, Outcome(summaries, None, notes)), None


def _document(
    source: Source, source_path: Path, plan: Plan, fit: dict[str, Any] | None, outcome: Outcome
) -> dict[str, Any]:
    """replay.json's document (report.replay_section describes it)."""
    notes = [*source.notes, *plan.notes, *outcome.notes]
    notes += [] if names_anyone(source.trace) else [UNNAMED_HARM]
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
        "caching": CACHING[0] if plan.cache_outputs else CACHING[1],
        "in_request_order": plan.in_request,
        "fit": fit,
        "notes": notes,
        "fidelity": None if outcome.fidelity is None else outcome.fidelity.to_dict(),
        "results": [s.to_dict() for s in outcome.summaries],
    }


def write_replay(run_dir: Path, doc: dict[str, Any]) -> list[Path]:
    """RUN/replay.json and RUN/replay.png (its hit ratio vs capacity; left out when it cannot be
    drawn): the files written."""
    from kvscope.records.run_dir import REPLAY_JSON, REPLAY_PNG
    from kvscope.report import plots
    from kvscope.report.replay_section import replay_plot

    written = [run_dir / REPLAY_JSON]
    written[0].write_text(json.dumps(doc, indent=2))
    if png := plots.write_png(
        replay_plot(doc["results"], doc["run_capacity_tokens"]), run_dir / REPLAY_PNG
    ):
        written.append(png)
    return written


def replay_run(run_dir: Path) -> list[Path]:
    """Replay a run directory with the default plan (its engine's policies at its capacity) and
    write RUN/replay.json (+ .png): the files written. What a sweep with `replay: true` runs
    after each point, so its compare report sets each run's replayed numbers beside its own."""
    from kvscope.sim.inputs.sources import load_source

    source = load_source(run_dir)
    plan = plan_of(source, None, None, None)
    return write_replay(run_dir, replay_document(source, run_dir, plan))


def export(source: Source, to_mooncake: Path | None, to_tokens: Path | None) -> list[Path]:
    """The source's replayed requests as a Mooncake and/or a token-id trace (sim.inputs.convert;
    replaying those gives the same results): the files written."""
    from kvscope.sim.inputs.convert import mooncake_rows, token_rows, write_trace

    if to_tokens is not None and source.run_dir is None:
        raise KvscopeError("--to-tokens needs a run directory (its prompt token ids)")
    written = []
    for path, rows in ((to_mooncake, mooncake_rows), (to_tokens, token_rows)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_trace(rows(source), path)
            written.append(path)
    return written
