"""The sections of one run's report: overview, RQ1 (agents, turns, provenance), RQ2 (transitions),
RQ6 (latency, TTFT), the KV usage timeline and the evictions, each from the run's RunAnalysis."""

import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa

from kvscope.analysis.across_runs import ALL, distinct_values, layout_comparison
from kvscope.analysis.run import RunAnalysis
from kvscope.records.metrics import Series
from kvscope.records.requests import PROVENANCE_COLUMNS as PROVENANCE
from kvscope.records.run_dir import TIMELINE_PNG, replica_dir
from kvscope.report import plots, sequences, timeline
from kvscope.report.columns import COLUMNS
from kvscope.report.prose import say
from kvscope.report.replay_section import replay_section
from kvscope.report.routing_section import routing_section
from kvscope.report.table import NULL, Column, Section, Table, facts, fmt, table

WORKFLOW_ROWS = 200  # the per-workflow table's rows at most (the longest critical paths)


def run_sections(run: RunAnalysis) -> list[Section]:
    return [
        overview(run),
        agents(run),
        turns(run),
        provenance(run),
        transitions(run),
        predictability(run),
        latency(run),
        ttft(run),
        *timeline_sections(run),  # a deployment's: one per replica
        evictions(run),
        *routing_section(run),  # a deployment's run: replicas behind a router
        *replay_section(run.run_dir),  # when `kvscope replay RUN` wrote replay.json
    ]


def overview(run: RunAnalysis) -> Section:
    req, cfg = run.requests, run.config
    engine, workload = cfg.get("engine") or {}, cfg.get("workload") or {}
    if cfg.get("app"):  # a profiled app or a live replay: the workload section is a default
        workflows = len(set(req["workflow_run_id"].drop_null().to_pylist()))
        workload = {"workflows": workflows or NULL, "concurrency": NULL}
    whole = next(
        (r for r in layout_comparison({run.label: req}).to_pylist() if r["agent_id"] == ALL), {}
    )
    capacity = run.kv_capacity
    default = " (engine default)" if run.kv_capacity_config is None else ""
    pairs = [
        ("run", run.label),
        ("engine", str(engine.get("kind", "unknown"))),
        *([("replay of", str(run.run["replay_of"]))] if run.run.get("replay_of") else []),
        ("prompt layout", str(workload.get("layout", distinct_values(req, "prompt_layout")))),
        (
            "workflows x concurrency",
            f"{workload.get('workflows', NULL)} x {workload.get('concurrency', NULL)}",
        ),
        ("KV capacity (tokens)", NULL if capacity is None else f"{capacity:,}{default}"),
        ("LLM calls", f"{req.num_rows} ({whole.get('failed', 0)} failed)"),
        ("weighted hit ratio (run)", fmt(whole.get("weighted_hit_ratio"), "ratio")),
        ("recompute burden (run)", fmt(whole.get("recompute_burden"), "int")),
    ]
    notes = []
    if req.num_rows and req["cached_self_tokens"].null_count == req.num_rows:
        notes.append(say("overview_no_provenance"))
    if req.num_rows and req["first_divergence_previous_agent"].null_count == req.num_rows:
        notes.append(say("overview_no_prompt_tokens"))
    return Section("overview", "Run", "", tables=[facts("", pairs)], notes=notes)


def _section(
    key: str, title: str, image: str | None, tables: list[Table] | None = None,
    notes: list[str] | None = None,
) -> Section:  # fmt: skip
    """A section whose intro and missing-image sentence are the prose's `<key>_intro` and
    `<key>_missing`."""
    return Section(key, title, say(f"{key}_intro"), image, say(f"{key}_missing"), tables or [],
                   notes or [])  # fmt: skip


def agents(run: RunAnalysis) -> Section:
    summary = run.agent_table()
    return _section(
        "agents",
        "RQ1: per agent",
        plots.agent_bars(summary, run.order),
        [table(summary, COLUMNS["agent"], "per agent")],
    )


def turns(run: RunAnalysis) -> Section:
    lines = plots.turn_lines(run.turns, run.order)
    return Section(
        "turns",
        "RQ1: per agent and turn",
        say("turns_intro"),
        lines,
        "" if lines else say("turns_missing"),
        [table(run.turns, COLUMNS["turn"], "per agent x turn")],
    )


def provenance_table(run: RunAnalysis) -> Table:
    """Per agent, its prompt tokens by where they came from (Level 3)."""
    data = pa.Table.from_pylist([{"agent_id": a, **v} for a, v in run.provenance.items()])
    cols = (
        Column("agent_id", "agent", "text"),
        Column("calls", "calls"),
        Column("provenance_calls", "with provenance"),
        *(Column(name, label) for name, label, _ in plots.PROVENANCE_PARTS),
    )
    return table(data, cols, "per agent (tokens)")


def provenance(run: RunAnalysis) -> Section:
    sums = run.provenance
    return _section(
        "provenance",
        "RQ1: who the cache served, and why the rest was computed",
        plots.provenance_bars(sums, run.order),
        [provenance_table(run)] if sums else [],
    )


def transitions(run: RunAnalysis) -> Section:
    pairs = run.transitions
    has_prov = any(v for v in pairs["provenance_calls"].to_pylist())
    hidden = {"provenance_calls", *PROVENANCE}
    cols = COLUMNS["pair"] if has_prov else [x for x in COLUMNS["pair"] if x.name not in hidden]
    return _section(
        "transitions",
        "RQ2: transitions",
        plots.transition_heatmap(pairs, run.order),
        [table(pairs, cols, "transitions", drop_null=True)],
        [] if has_prov else [say("transitions_no_provenance")],
    )


def predictability(run: RunAnalysis) -> Section:
    """Agent sequences, reuse distance per agent, next-agent predictor (report.sequences)."""
    return sequences.section(run.predictability, run.order)


def latency(run: RunAnalysis) -> Section:
    known = any(v is not None for v in run.latency["cache_miss_ms"].to_pylist())
    flagged = [r for r in run.latency.to_pylist() if r["flag"]]
    shown, title = run.workflows, "per workflow: all calls and its critical path (ms)"
    if shown.num_rows > WORKFLOW_ROWS:  # a large run: its slowest, not a page per thousand
        shown = shown.sort_by([("critical_path_ms", "descending")]).slice(0, WORKFLOW_ROWS)
        title = (f"per workflow: the {WORKFLOW_ROWS} of {run.workflows.num_rows:,} with the "
                 "longest critical path, all calls and its critical path (ms)")  # fmt: skip
    short = shown.set_column(
        0,
        "workflow_run_id",
        pa.array([w and w[:8] for w in shown["workflow_run_id"].to_pylist()], pa.string()),
    )
    return _section(
        "latency",
        "RQ6: where workflow time goes",
        plots.latency_stack(run.latency),
        [
            table(run.latency, COLUMNS["latency"], "per agent, all workflows (ms)", drop_null=True),
            table(short, COLUMNS["workflow"], title, drop_null=True),
        ],
        [
            say("fit", run.fit),
            say("cache_miss", known),
            *(say("flag", r) for r in flagged),
            *(say("time_split", t) for t in run.time_split),
        ],
    )


def ttft(run: RunAnalysis) -> Section:
    return _section(
        "ttft",
        "TTFT vs new prefill tokens",
        plots.ttft_scatter(run.calls, run.fit, run.order),
    )


def timeline_sections(run: RunAnalysis) -> list[Section]:
    """KV usage over time: the engine's; a deployment's, one per replica (its cache, the calls
    placed on it)."""
    if not run.replicas:
        rows = partial(timeline.call_rows, run.requests)
        return [_timeline("timeline", "", run.run_dir, rows, run.series, run)]
    out = []
    for r in run.replicas:
        mine = _replica_rows(run, r.name)
        folder = replica_dir(run.run_dir, r.name)
        out.append(_timeline(f"timeline-{r.name}", f": {r.name}", folder, mine, r.series, run))
    return out


def _replica_rows(run: RunAnalysis, name: str) -> Callable[[], list[dict]]:
    return lambda: [x for x in timeline.call_rows(run.requests) if x.get("replica") == name]


def _timeline(
    key: str, suffix: str, folder: Path, rows: Callable[[], list[dict]], series: Series,
    run: RunAnalysis,
) -> Section:  # fmt: skip
    """`rows`: the calls to draw, asked for only where the figure is not written yet (a
    100k-call run's rows as dicts: ~1.5 s)."""
    png = folder / TIMELINE_PNG
    image = None
    if png.exists():
        image = plots.file_uri(png)
    elif series and (drawn := rows()):
        with tempfile.TemporaryDirectory() as tmp:
            path = timeline.plot(drawn, series, Path(tmp) / TIMELINE_PNG, run.label + suffix)
            image = plots.file_uri(path)
    title = "KV usage over time" + suffix
    return Section(key, title, say("timeline_intro"), image, say("timeline_missing"))


def evictions(run: RunAnalysis) -> Section:
    pairs = run.evictions
    recorded = pairs is not None
    return Section(
        "evictions",
        "Evictions",
        say("evictions_intro"),
        plots.eviction_heatmap(pairs, run.order) if pairs is not None else None,
        say("evictions_missing", recorded),
        [table(pairs, COLUMNS["eviction"], "evictor x victim")]
        if pairs is not None and pairs.num_rows
        else [],
    )
