"""Self-contained HTML reports: one run (`run_report`) or several side by side (`compare_report`).

Figures are embedded PNG data URIs and the CSS is inline: the file opens anywhere, offline.
A view whose data is missing is replaced by a sentence that says what is missing.
"""

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from jinja2 import Environment, PackageLoader, select_autoescape

from kvscope import store
from kvscope.analysis import evictions, latency, provenance, runs, transitions, turns
from kvscope.analysis.time_split import TimeSplit, time_split
from kvscope.collect.metrics import instant_series
from kvscope.errors import KvscopeError
from kvscope.finalize import BLOCKS_PARQUET, METRICS_PARQUET
from kvscope.probe.tokens import common_prefix
from kvscope.report import plots, timeline

REPORT_HTML = "report.html"
TIMELINE_PNG = "timeline.png"
NULL = "—"  # shown for a value that was not measured


@dataclass(frozen=True)
class Column:
    name: str
    header: str
    kind: str = "int"  # int | ratio | ms | float | text | bool


@dataclass(frozen=True)
class TableView:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""
    text: list[bool] = field(default_factory=list)  # per column: left-aligned text


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    intro: str
    image: str | None = None  # data URI
    missing: str = ""  # the sentence shown instead of the image
    tables: list[TableView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunData:
    """One run directory, loaded and analysed."""

    run_dir: Path
    label: str
    config: dict[str, Any]
    requests: pa.Table
    agents: pa.Table
    turns: pa.Table
    pairs: pa.Table
    fit: latency.PrefillFit | None
    calls: pa.Table
    latency: pa.Table
    workflows: pa.Table
    evictions: pa.Table | None  # None: no blocks.parquet
    series: dict[str, list[tuple[int, float]]]
    time_split: list[TimeSplit]  # client / engine front end / core; empty without histograms

    @property
    def kv_capacity_config(self) -> int | None:
        return (self.config.get("engine") or {}).get("kv_capacity_tokens")

    @property
    def kv_capacity(self) -> int | None:
        """The configured KV capacity, else the one the engine reported in /metrics."""
        measured = self.series.get("kv_capacity_tokens")
        if self.kv_capacity_config is not None:
            return int(self.kv_capacity_config)
        return int(measured[-1][1]) if measured else None

    @property
    def concurrency(self) -> int | None:
        return (self.config.get("workload") or {}).get("concurrency")


def load_run(run_dir: Path, label: str | None = None) -> RunData:
    """Read a run directory and run the per-run analyses (RQ1, RQ2, RQ6, evictions)."""
    if (
        not (run_dir / store.REQUESTS_PARQUET).exists()
        and not (run_dir / store.REQUESTS_JSONL).exists()
    ):
        raise KvscopeError(f"{run_dir} has no request table: not a kvscope run directory")
    requests = turns.conform(store.load_requests(run_dir))
    run_json = run_dir / store.RUN_JSON
    config = json.loads(run_json.read_text()).get("config", {}) if run_json.exists() else {}
    fit = latency.fit_prefill_cost(requests)
    blocks = run_dir / BLOCKS_PARQUET
    metrics = run_dir / METRICS_PARQUET
    metrics_table = pq.read_table(metrics) if metrics.exists() else None
    return RunData(
        run_dir=run_dir,
        label=label or run_dir.name,
        config=config,
        requests=requests,
        agents=turns.agent_summary(requests),
        turns=turns.agent_turns(requests),
        pairs=transitions.transitions(requests),
        fit=fit,
        calls=latency.call_rows(requests, fit),
        latency=latency.agent_breakdown(requests, fit),
        workflows=latency.workflow_breakdown(requests, fit),
        evictions=evictions.matrix(pq.read_table(blocks)) if blocks.exists() else None,
        series=instant_series(metrics_table) if metrics_table is not None else {},
        time_split=time_split(requests.to_pylist(), metrics_table.to_pylist())
        if metrics_table is not None
        else [],
    )


# --- formatting -------------------------------------------------------------------------------


def fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NULL
    if kind == "ratio":
        return f"{100 * value:.1f}%"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "ms":
        return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.1f}"
    if kind == "float":
        return f"{value:,.2f}"
    if kind == "bool":
        return "yes" if value else "no"
    return str(value)


def table_view(
    table: pa.Table, columns: Sequence[Column], title: str, note: str = "", drop_null: bool = False
) -> TableView:
    """A table for the page; with drop_null, columns that are null in every row are left out."""
    rows = table.to_pylist()
    cols = [c for c in columns if c.name in table.column_names]
    if drop_null:
        cols = [c for c in cols if c.kind == "text" or any(r[c.name] is not None for r in rows)]
    return TableView(
        title,
        [c.header for c in cols],
        [[fmt(r[c.name], c.kind) for c in cols] for r in rows],
        note,
        [c.kind == "text" for c in cols],
    )


CACHE_COLUMNS = (
    Column("calls", "calls"),
    Column("failed", "failed"),
    Column("prompt_tokens", "prompt tokens"),
    Column("cached_tokens", "cached tokens"),
    Column("weighted_hit_ratio", "weighted hit", "ratio"),
    Column("recompute_burden", "recompute burden"),
    Column("ttft_p50_ms", "TTFT p50 ms", "ms"),
)
AGENT_COLUMNS = (
    Column("agent_id", "agent", "text"),
    Column("calls", "calls"),
    Column("failed", "failed"),
    Column("prompt_tokens_p50", "prompt p50"),
    Column("cached_tokens_p50", "cached p50"),
    Column("new_prefill_tokens_p50", "new prefill p50"),
    Column("weighted_hit_ratio", "weighted hit", "ratio"),
    Column("new_prefill_tokens", "recompute burden"),
    Column("ttft_p50_ms", "TTFT p50 ms", "ms"),
    Column("ttft_p95_ms", "TTFT p95 ms", "ms"),
    Column("tpot_p50_ms", "TPOT p50 ms", "ms"),
    Column("e2e_p50_ms", "e2e p50 ms", "ms"),
    Column("tool_ms", "tool ms", "ms"),
)
TURN_COLUMNS = (Column("agent_id", "agent", "text"), Column("turn_id", "turn"), *CACHE_COLUMNS)
PROVENANCE_COLUMNS = tuple(
    Column(c, c.removesuffix("_tokens").replace("_", " ")) for c in turns.PROVENANCE
)
PAIR_COLUMNS = (
    Column("kind", "kind", "text"),
    Column("from_agent", "from", "text"),
    Column("to_agent", "to", "text"),
    *CACHE_COLUMNS,
    Column("miss_share", "miss share", "ratio"),
    Column("miss_calls", "calls with 0 cached"),
    Column("shared_prefix_tokens", "shared prefix"),
    Column("unserved_shared_prefix_tokens", "shared prefix recomputed"),
    Column("gap_ms_p50", "gap p50 ms", "ms"),
    Column("provenance_calls", "calls with provenance"),
    *PROVENANCE_COLUMNS,
)
SHORT_COMPONENTS = {
    "queue_ms": "queue",
    "prefill_ms": "prefill",
    "ttft_unsplit_ms": "TTFT not split",
    "decode_ms": "decode",
    "call_other_ms": "call overhead",
    "failed_ms": "failed calls",
    "tool_ms": "tool",
    "other_ms": "other/ client",
}
COMPONENT_COLUMNS = tuple(Column(c, SHORT_COMPONENTS[c], "ms") for c in latency.COMPONENTS)
LATENCY_COLUMNS = (
    Column("agent_id", "agent", "text"),
    Column("calls", "calls"),
    *COMPONENT_COLUMNS,
    Column("path_ms", "total", "ms"),
    Column("share", "share of workflow time", "ratio"),
    Column("weighted_hit_ratio", "weighted hit", "ratio"),
    Column("cache_miss_ms", "cache-miss cost", "ms"),
    Column("flag", "flag", "text"),
)
WORKFLOW_COLUMNS = (
    Column("workflow_run_id", "workflow", "text"),
    Column("calls", "calls"),
    Column("failed", "failed"),
    *COMPONENT_COLUMNS,
    Column("path_ms", "critical path", "ms"),
    Column("wall_ms", "wall time", "ms"),
    Column("weighted_hit_ratio", "weighted hit", "ratio"),
    Column("slowest_agent", "slowest agent", "text"),
)
EVICTION_COLUMNS = (
    Column("evictor_agent_id", "evictor", "text"),
    Column("victim_agent_id", "victim", "text"),
    Column("evictions", "blocks evicted"),
    Column("same_workflow", "same workflow"),
    Column("harmful", "harmful"),
    Column("recomputed_tokens", "recomputed tokens"),
    Column("residency_ms_p50", "residency p50 ms", "ms"),
)
RUNS_COLUMNS = (
    Column("run", "run", "text"),
    Column("agent_id", "agent", "text"),
    *CACHE_COLUMNS,
    Column("cached_cross_agent_tokens", "cross-agent cached"),
    Column("first_divergence_previous_agent_mean", "first divergence vs previous (mean)"),
    Column("max_reusable_tokens_mean", "max reusable (mean)"),
)


# --- sections of one run ----------------------------------------------------------------------


def _short(workflows: pa.Table) -> pa.Table:
    ids = [w[:8] for w in workflows["workflow_run_id"].to_pylist()]
    return workflows.set_column(0, "workflow_run_id", pa.array(ids, pa.string()))


def overview(data: RunData) -> Section:
    req, cfg = data.requests, data.config
    engine, workload = cfg.get("engine") or {}, cfg.get("workload") or {}
    total = runs.layout_comparison({data.label: req}).to_pylist()
    whole = next((r for r in total if r["agent_id"] == runs.ALL), {})
    capacity = data.kv_capacity
    facts = [
        ["run", data.label],
        ["engine", str(engine.get("kind", "unknown"))],
        ["prompt layout", str(workload.get("layout", runs.distinct_values(req, "prompt_layout")))],
        [
            "workflows x concurrency",
            f"{workload.get('workflows', NULL)} x {workload.get('concurrency', NULL)}",
        ],
        [
            "KV capacity (tokens)",
            NULL
            if capacity is None
            else f"{capacity:,}" + (" (engine default)" if data.kv_capacity_config is None else ""),
        ],
        ["LLM calls", f"{req.num_rows} ({whole.get('failed', 0)} failed)"],
        ["weighted hit ratio (run)", fmt(whole.get("weighted_hit_ratio"), "ratio")],
        ["recompute burden (run)", fmt(whole.get("recompute_burden"), "int")],
    ]
    notes = []
    if req.num_rows and req["cached_self_tokens"].null_count == req.num_rows:
        notes.append(
            "Level-3 provenance (cached self / cross-agent / cross-workflow, uncached evicted /"
            " layout / cold) was not measured in this run: those columns show "
            f"{NULL}, and the cache-miss cost cannot be computed."
        )
    if req.num_rows and req["first_divergence_previous_agent"].null_count == req.num_rows:
        notes.append(
            f"Prompt instrumentation (first divergence, max reusable) shows {NULL}: "
            "not measured in this run."
        )
    return Section(
        "overview",
        "Run",
        "",
        tables=[TableView("", ["", ""], facts, text=[True, False])],
        notes=notes,
    )


def agent_section(data: RunData) -> list[Section]:
    agents = Section(
        "agents",
        "RQ1: per agent",
        "Weighted hit ratio = cached / prompt tokens summed over the agent's successful calls; "
        "recompute burden = prompt tokens computed instead of reused.",
        plots.agent_bars(data.agents),
        "No call of this run has both prompt and cached tokens measured.",
        [table_view(data.agents, AGENT_COLUMNS, "per agent")],
    )
    lines = plots.turn_lines(data.turns)
    per_turn = Section(
        "turns",
        "RQ1: per agent and turn",
        "How each agent's reuse changes from one PEER cycle to the next.",
        lines,
        "" if lines else "Only one turn was measured: nothing to compare across turns.",
        [table_view(data.turns, TURN_COLUMNS, "per agent x turn")],
    )
    return [agents, per_turn]


def provenance_section(data: RunData) -> Section:
    sums = provenance.by_agent(data.requests.to_pylist())
    table = pa.Table.from_pylist([{"agent_id": a, **v} for a, v in sums.items()])
    columns = (Column("agent_id", "agent", "text"),
               *(Column(c, label) for c, label, _ in plots.PROVENANCE_PARTS))  # fmt: skip
    return Section(
        "provenance",
        "RQ1: who the cache served, and why the rest was computed",
        "From the engine's KV events: cached tokens by who stored the block (this agent earlier "
        "in the workflow, another agent, another workflow), computed tokens by cause (evicted "
        "after being stored with this exact prefix, seen before behind another prefix = layout, "
        "never seen = cold).",
        plots.provenance_bars(sums),
        "No KV events were recorded for this run (or no call's tokens could be matched).",
        [table_view(table, columns, "per agent (tokens)")] if sums else [],
    )


def transition_section(data: RunData) -> Section:
    has_prov = any(v for v in data.pairs["provenance_calls"].to_pylist())
    prov = {"provenance_calls", *turns.PROVENANCE}
    columns = PAIR_COLUMNS if has_prov else [c for c in PAIR_COLUMNS if c.name not in prov]
    return Section(
        "transitions",
        "RQ2: transitions",
        "Handoff = the workflow's previous call -> this call; same-agent = this agent's "
        "previous call in the workflow -> this call. Numbers are those of the receiving call; "
        "miss share = share of its prompt not served from the cache; shared prefix = tokens "
        "the call shares with the 'from' call, recomputed = those of them not served.",
        plots.transition_heatmap(data.pairs),
        "No transition has measured cached tokens.",
        [table_view(data.pairs, columns, "transitions", drop_null=True)],
        [] if has_prov else ["Provenance columns are left out: not measured in this run."],
    )


def split_note(t: TimeSplit) -> str:
    """Where the call overhead sits: the client's side or the engine's front end."""
    span = "TTFT" if t.span == "ttft" else "Call time (e2e)"
    if not t.matched:
        return (
            f"{span} is not split between client and engine: the engine counted "
            f"{fmt(t.engine_requests, 'int')} requests, the table has {t.rows} measured calls."
        )
    core = "queue + prefill" if t.span == "ttft" else "queue + prefill + decode"
    return (
        f"{span} summed over {t.rows} calls: the client's {_sec(t.client_ms)} = the engine's "
        f"{_sec(t.engine_ms)} (its core's {core} {_sec(t.core_ms)}, its front end "
        f"{_sec(t.front_end_ms)}: templating, tokenizing, hand-offs) + {_sec(t.client_side_ms)} "
        "on the client's side (network, the client process)."
    )


def _sec(ms: float | None) -> str:
    return NULL if ms is None else f"{ms / 1000:,.1f} s"


def latency_section(data: RunData) -> list[Section]:
    fit = data.fit
    if fit is None:
        fit_note = "Too few calls with prefill or TTFT and token counts to fit a prefill cost."
    else:
        fit_note = (
            f"Prefill cost fit ({fit.fit_on} over {fit.rows} calls): {fit.intercept_ms:.0f} ms + "
            f"{fit.ms_per_token:.3f} ms per new prefill token"
            + ("" if fit.r2 is None else f", R² {fit.r2:.2f}")
            + (
                "."
                if fit.fit_on == "prefill_ms"
                else " (no prefill time known: TTFT, which includes queueing)."
            )
        )
    miss_known = any(v is not None for v in data.latency["cache_miss_ms"].to_pylist())
    miss_note = (
        "Cache-miss cost = fitted ms per token x (uncached evicted + uncached layout tokens)."
        if miss_known
        else "Cache-miss cost is not shown: it needs the Level-3 provenance columns "
        "(uncached evicted / layout tokens), which this run did not measure."
    )
    flagged = [r for r in data.latency.to_pylist() if r["flag"]]
    flag_notes = [
        f"{r['agent_id']}: {r['flag']} (hit {fmt(r['weighted_hit_ratio'], 'ratio')}, "
        f"{fmt(r['share'], 'ratio')} of workflow time)"
        for r in flagged
    ]
    breakdown = Section(
        "latency",
        "RQ6: where workflow time goes",
        "PEER runs its agents one after another, so a workflow's critical path is its chain of "
        "calls, plus tool time and the gaps between calls (other/client). Prefill = the engine's "
        "prefill time, else TTFT - queue; decode = the engine's decode time, else e2e - TTFT.",
        plots.latency_stack(data.latency),
        "No call time was measured.",
        [
            table_view(
                data.latency, LATENCY_COLUMNS, "per agent, all workflows (ms)", drop_null=True
            ),
            table_view(
                _short(data.workflows),
                WORKFLOW_COLUMNS,
                "per workflow, along its critical path (ms)",
                drop_null=True,
            ),
        ],
        [fit_note, miss_note, *flag_notes, *map(split_note, data.time_split)],
    )
    scatter = Section(
        "ttft",
        "TTFT vs new prefill tokens",
        "Each successful call; the dashed line is the prefill-cost fit.",
        plots.ttft_scatter(data.calls, data.fit),
        "No successful call has both TTFT and token counts.",
    )
    return [breakdown, scatter]


def timeline_section(data: RunData) -> Section:
    intro = (
        "KV cache use and running/queued requests from the engine's /metrics, with every "
        "agent call on the same time axis (one lane per workflow)."
    )
    png = data.run_dir / TIMELINE_PNG
    image = None
    if png.exists():
        image = plots.file_uri(png)
    elif data.series and data.requests.num_rows:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = timeline.plot(
                data.requests.to_pylist(), data.series, Path(tmp) / TIMELINE_PNG, data.label
            )
            image = plots.file_uri(path)
    return Section(
        "timeline",
        "KV usage over time",
        intro,
        image,
        "No /metrics series were recorded for this run (metrics.parquet missing).",
    )


def eviction_section(data: RunData) -> Section:
    intro = (
        "Blocks evicted from the KV cache, by the agent whose call caused the eviction "
        "(evictor) and the agent that had stored the block (victim). Harmful = a later "
        "call needed the block and recomputed it."
    )
    if data.evictions is None:
        return Section(
            "evictions",
            "Evictions",
            intro,
            None,
            "No KV events recorded for this run (blocks.parquet missing).",
        )
    return Section(
        "evictions",
        "Evictions",
        intro,
        plots.eviction_heatmap(data.evictions),
        "KV events were recorded, but no block was evicted.",
        [table_view(data.evictions, EVICTION_COLUMNS, "evictor x victim")]
        if data.evictions.num_rows
        else [],
    )


def run_sections(data: RunData) -> list[Section]:
    return [
        overview(data),
        *agent_section(data),
        provenance_section(data),
        transition_section(data),
        *latency_section(data),
        timeline_section(data),
        eviction_section(data),
    ]


# --- pages ------------------------------------------------------------------------------------


def _env() -> Environment:
    return Environment(
        loader=PackageLoader("kvscope.report", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_run(data: RunData) -> str:
    page = _env().get_template("report.html")
    return page.render(title=data.label, sections=run_sections(data), null=NULL)


def run_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write RUN/report.html (or `out`) for one run directory."""
    out = out or run_dir / REPORT_HTML
    out.write_text(render_run(load_run(run_dir)), encoding="utf-8")
    return out


_STAMP = re.compile(r"-\d{8}-\d{6}-[0-9a-f]{6}$")  # store.new_run's time and random suffix


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Short, unique labels: run names without their time stamp and the prefix they share."""
    names = [p.name for p in run_dirs]
    short = [_STAMP.sub("", n) for n in names]
    if len(short) > 1:
        common = short[0][: min(common_prefix(short[0], n) for n in short)]
        common = common[: common.rfind("-") + 1] if "-" in common else ""
        if all(len(n) > len(common) for n in short):
            short = [n[len(common) :] for n in short]
    if len(set(short)) < len(short):
        short = names
    return [n if short.count(n) == 1 else f"{n} ({i + 1})" for i, n in enumerate(short)]


# Settings that change what a run measures besides KV capacity and concurrency: runs that differ
# in one are not compared along the pressure axes (RQ4).
GROUP_KEYS = (
    "engine.kind", "engine.model", "engine.prefix_cache", "engine.eviction_policy",
    "engine.page_size", "engine.hierarchical_cache", "engine.context_length",
    "workload.mode", "workload.loop", "workload.cycles", "workload.max_cycles",
    "workload.layout", "workload.sharing", "workload.max_tokens", "workload.tool",
    "workload.synthetic",
)  # fmt: skip


def sweep_groups(data: Sequence[RunData]) -> list[str | None]:
    """Per run, the GROUP_KEYS settings in which the runs differ ("layout=role-first"); None for
    every run when they differ in none. A setting a run's config lacks (recorded before the
    setting existed) is not held against it: only two different recorded values differ."""

    def setting(d: RunData, key: str) -> str | None:
        section, name = key.split(".")
        values = d.config.get(section) or {}
        return json.dumps(values[name], sort_keys=True) if name in values else None

    differ = [k for k in GROUP_KEYS if len({setting(d, k) for d in data} - {None}) > 1]
    if not differ:
        return [None] * len(data)
    return [
        ", ".join(
            f"{k.split('.')[1]}={json.loads(v)}" for k in differ if (v := setting(d, k)) is not None
        )
        for d in data
    ]


def cross_run_sections(data: Sequence[RunData]) -> list[Section]:
    """RQ3 (layouts), RQ4 (pressure: capacity and concurrency) and RQ5 (sharing modes)."""
    by_label = {d.label: d.requests for d in data}
    layout = runs.layout_comparison(by_label)
    rq3 = Section(
        "rq3",
        "RQ3: prompt layout",
        "The same agents under each run's prompt layout; first divergence = tokens a call "
        "shares with the workflow's previous call; max reusable = longest prefix shared with "
        "any earlier call of the run.",
        tables=[
            table_view(
                layout,
                (RUNS_COLUMNS[0], Column("prompt_layout", "layout", "text"), *RUNS_COLUMNS[1:]),
                "per run and agent",
                drop_null=True,
            )
        ],
    )
    params = [
        (
            {
                "run": d.label,
                "kv_capacity_tokens": d.kv_capacity,
                "concurrency": d.concurrency,
                "group": group,
            },
            d.requests,
        )
        for d, group in zip(data, sweep_groups(data), strict=True)
    ]
    sweep = runs.pressure_sweep(params)
    capacities = {d.kv_capacity_config for d in data}
    losses = runs.first_to_lose_reuse(sweep) if len(capacities) > 1 else []
    loss_notes = [
        f"{loss.agent_id} loses reuse first: its hit ratio falls from "
        f"{fmt(loss.reference_ratio, 'ratio')} at {loss.reference_at:,} tokens to "
        f"{fmt(loss.ratio, 'ratio')} at {loss.at:,} tokens (below {runs.LOSS_THRESHOLD:.0%} of "
        "its value at the largest capacity)"
        + ("" if loss.fixed is None else f", concurrency {loss.fixed}")
        + ("" if loss.group is None else f", {loss.group}")
        + "."
        for loss in losses
    ]
    if len(capacities) > 1 and not losses:
        loss_notes.append(
            f"No agent's hit ratio fell below {runs.LOSS_THRESHOLD:.0%} of its "
            "value at the largest capacity."
        )
    conc = {d.concurrency for d in data}
    conc_losses = runs.first_to_lose_reuse(sweep, axis="concurrency") if len(conc) > 1 else []
    loss_notes += [
        f"As concurrency grows, {loss.agent_id} loses reuse first (at concurrency {loss.at}, "
        f"{fmt(loss.ratio, 'ratio')} vs {fmt(loss.reference_ratio, 'ratio')} at "
        f"{loss.reference_at}"
        + ("" if loss.fixed is None else f", KV capacity {loss.fixed:,}")
        + ("" if loss.group is None else f", {loss.group}")
        + ")."
        for loss in conc_losses
    ]
    image = plots.capacity_lines(sweep, losses) if len(capacities) > 1 else None
    rq4 = Section(
        "rq4",
        "RQ4: cache pressure",
        "Per-agent reuse against KV capacity (engine.kv_capacity_tokens, or the engine's own "
        "when not set) and concurrency.",
        image,
        "The runs do not differ in engine.kv_capacity_tokens: no capacity plot.",
        [
            table_view(
                sweep,
                (
                    RUNS_COLUMNS[0],
                    Column("kv_capacity_tokens", "KV capacity"),
                    Column("concurrency", "concurrency"),
                    Column("group", "differs in", "text"),
                    *RUNS_COLUMNS[1:],
                ),
                "per run and agent",
                drop_null=True,
            )
        ],
        loss_notes,
    )
    sharing = runs.sharing_comparison(by_label)
    rq5 = Section(
        "rq5",
        "RQ5: sharing modes",
        "What the agents' prompts share (none, system prompt, task, documents, a whole earlier "
        "branch), per mode and agent.",
        tables=[
            table_view(
                sharing,
                (Column("sharing_mode", "sharing", "text"), *RUNS_COLUMNS),
                "per mode, run and agent",
                drop_null=True,
            )
        ],
    )
    # The questions whose variable differs between the runs come first, with their tables; the
    # others are one sentence each (a table of identical settings answers nothing).
    varied = {
        "rq3": len({_workload(d, "layout") for d in data}) > 1,
        "rq4": len(capacities) > 1 or len(conc) > 1,
        "rq5": len({_workload(d, "sharing") or "documents" for d in data}) > 1,
    }
    what = {"rq3": "prompt layout", "rq4": "KV capacity or concurrency", "rq5": "sharing mode"}
    sections = [
        s if varied[s.key] else Section(
            s.key, s.title, f"The runs do not differ in {what[s.key]}: nothing to compare."
        )
        for s in (rq3, rq4, rq5)
    ]  # fmt: skip
    return sorted(sections, key=lambda s: not varied[s.key])


def _workload(data: RunData, key: str) -> Any:
    return (data.config.get("workload") or {}).get(key)


def compare_report(run_dirs: list[Path], out: Path) -> Path:
    """Write one HTML page comparing the runs: each run's views side by side, then RQ3-RQ5."""
    if not run_dirs:
        raise KvscopeError("compare needs at least one run directory")
    data = [load_run(p, label) for p, label in zip(run_dirs, run_labels(run_dirs), strict=True)]
    per_run = [run_sections(d) for d in data]
    rows = [[sections[i] for sections in per_run] for i in range(len(per_run[0]))]
    html = (
        _env()
        .get_template("compare.html")
        .render(
            title=f"{len(data)} runs compared",
            labels=[d.label for d in data],
            rows=rows,
            cross=cross_run_sections(data),
            null=NULL,
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out
