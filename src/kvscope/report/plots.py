"""The report's figures, each from one analysis table, as PNG data URIs (self-contained HTML).

Every function returns None when its data is missing, so that the page says so in a sentence
instead of showing an empty plot.
"""

import base64
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.figure import Figure

from kvscope.analysis.across_runs import ALL, ReuseLoss, pooled
from kvscope.analysis.latency import COMPONENT_LABELS, COMPONENTS, PrefillFit
from kvscope.analysis.transitions import SAME_AGENT, matrix
from kvscope.records.agents import AgentOrder, agent_key
from kvscope.report.timeline import agent_color

COMPONENT_COLORS = {
    "queue_ms": "#e76f51",
    "prefill_ms": "#4C72B0",
    "ttft_unsplit_ms": "#8fb3de",
    "decode_ms": "#55A868",
    "call_other_ms": "#bbbbbb",
    "failed_ms": "#C44E52",
    "tool_ms": "#DD8452",
    "other_ms": "#e9d8a6",
}


def color(agent: str | None, order: AgentOrder = ()) -> str:
    """timeline.agent_color of an agent or of its label here (NO_AGENT = null)."""
    return agent_color(None if agent == NO_AGENT else agent, order)


def _key(order: AgentOrder) -> Any:
    """agents.agent_key over the labels of this module (null -> NO_AGENT, sorted last)."""
    return agent_key([NO_AGENT if a is None else a for a in order])


def data_uri(fig: Figure) -> str:
    """The figure as a PNG data URI; the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def write_png(uri: str | None, path: Path) -> Path | None:
    """A data URI from this module as a PNG file (for MLflow artifacts); None if no figure."""
    if uri is None:
        return None
    path.write_bytes(base64.b64decode(uri.split(",", 1)[1]))
    return path


def file_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


NO_AGENT = "(no agent)"  # the label of calls no agent was named for (agent_id null)
_AGENT_COLUMNS = ("agent_id", "to_agent", "evictor_agent_id", "victim_agent_id")


def _rows(table: pa.Table, skip_all: bool = True) -> list[dict[str, Any]]:
    """The table's rows, agents labelled (null -> NO_AGENT), the "all" row left out if asked."""
    rows = [r for r in table.to_pylist() if not (skip_all and r.get("agent_id") == ALL)]
    for r in rows:
        for column in _AGENT_COLUMNS:
            if column in r and r[column] is None:
                r[column] = NO_AGENT
    return rows


PROVENANCE_PARTS = (  # (column, label, color): cached in blues/greens, uncached in warm colours
    ("cached_self_tokens", "cached: same agent", "#2a6f97"),
    ("cached_cross_agent_tokens", "cached: other agent", "#61a5c2"),
    ("cached_cross_workflow_tokens", "cached: other workflow", "#52b788"),
    ("cached_unattributed_tokens", "cached: unattributed", "#b7e4c7"),
    ("uncached_evicted_tokens", "computed: evicted", "#d62828"),
    ("uncached_layout_tokens", "computed: layout", "#f77f00"),
    ("uncached_cold_tokens", "computed: cold", "#cccccc"),
)


def provenance_bars(sums: dict[str, dict[str, int]], order: AgentOrder = ()) -> str | None:
    """Per agent, its prompt tokens split by where they came from (Level 3 provenance)."""
    if not sums:
        return None
    agents = sorted(sums, key=agent_key(order))
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(agents) + 1.4))
    left = [0] * len(agents)
    for column, label, tint in PROVENANCE_PARTS:
        values = [sums[a][column] for a in agents]
        labels = [NO_AGENT if a is None else a for a in agents]
        ax.barh(labels, values, left=left, color=tint, label=label)
        left = [x + v for x, v in zip(left, values, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("prompt tokens, summed over the agent's calls")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("where each agent's prompt tokens came from", fontsize=10)
    fig.tight_layout()
    return data_uri(fig)


def agent_bars(agents: pa.Table, order: AgentOrder = ()) -> str | None:
    """Weighted hit ratio and recompute burden per agent (AgentSummary columns)."""
    rows = [r for r in _rows(agents) if r.get("weighted_hit_ratio") is not None]
    if not rows:
        return None
    names = [r["agent_id"] for r in rows]
    colors = [color(a, order) for a in names]
    fig, (hit, burden) = plt.subplots(1, 2, figsize=(10, 3.4))
    ratios = [100 * r["weighted_hit_ratio"] for r in rows]
    hit.bar(names, ratios, color=colors)
    hit.set_ylim(0, 105)
    hit.set_ylabel("weighted hit ratio (%)")
    hit.set_title("prompt tokens served from the KV cache", fontsize=10)
    for i, v in enumerate(ratios):
        hit.text(i, v + 1.5, f"{v:.1f}%", ha="center", fontsize=9)
    tokens = [r["new_prefill_tokens"] or 0 for r in rows]
    burden.bar(names, tokens, color=colors)
    burden.set_ylabel("recomputed prompt tokens")
    burden.set_title("recompute burden (sum of new prefill tokens)", fontsize=10)
    burden.set_ylim(0, max(tokens) * 1.15 or 1)
    for i, v in enumerate(tokens):
        burden.text(i, v, f"{v:,}", ha="center", va="bottom", fontsize=9)
    fig.tight_layout()
    return data_uri(fig)


def turn_lines(turns: pa.Table, order: AgentOrder = ()) -> str | None:
    """Weighted hit ratio per agent across its turns (agent_turns)."""
    rows = [
        r for r in _rows(turns) if r["weighted_hit_ratio"] is not None and r["turn_id"] is not None
    ]  # a call outside any graph has no turn
    if len({r["turn_id"] for r in rows}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for agent in sorted({r["agent_id"] for r in rows}, key=_key(order)):
        pts = sorted(
            (r["turn_id"], 100 * r["weighted_hit_ratio"]) for r in rows if r["agent_id"] == agent
        )
        ax.plot(*zip(*pts, strict=True), marker="o", color=color(agent, order), label=agent)
    ax.set_xlabel("turn (the agent's k-th visit in its workflow)")
    ax.set_ylabel("weighted hit ratio (%)")
    ax.set_xticks(sorted({r["turn_id"] for r in rows}))
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("reuse across turns", fontsize=10)
    fig.tight_layout()
    return data_uri(fig)


def _same_agent_row(pairs: pa.Table, tos: list[str], value: str) -> list[Any]:
    """Per "to" agent, the same-agent return's value (None where there is none)."""
    got = {r["to_agent"]: r[value] for r in _rows(pairs, False) if r["kind"] == SAME_AGENT}
    return [got.get(t) for t in tos]


def transition_heatmap(pairs: pa.Table, order: AgentOrder = ()) -> str | None:
    """previous agent x agent, weighted hit ratio of the handoffs (transitions).

    A last row, below a line, holds the same-agent returns (an agent's own previous call).
    """
    froms, tos, cells = matrix(pairs, order=order)
    calls = matrix(pairs, "calls", order=order)[2]
    same = _same_agent_row(pairs, tos, "weighted_hit_ratio")
    same_calls = _same_agent_row(pairs, tos, "calls")
    if any(n is not None for n in same_calls):
        froms, cells, calls = (
            [*froms, "same agent\n(own previous call)"],
            [*cells, same],
            [*calls, same_calls],
        )
    if not any(v is not None for row in cells for v in row):
        return None
    values = [[float("nan") if v is None else 100 * v for v in row] for row in cells]
    fig, ax = plt.subplots(figsize=(1.5 * len(tos) + 3.2, 0.75 * len(froms) + 1.6))
    cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")
    im = ax.imshow(values, cmap=cmap, vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(tos)), tos)
    ax.set_yticks(range(len(froms)), froms)
    ax.set_xlabel("agent (this call)")
    ax.set_ylabel("previous agent in the workflow")
    if froms[-1].startswith("same agent"):
        ax.axhline(len(froms) - 1.5, color="white", lw=4)
    for i, row in enumerate(cells):
        for j, v in enumerate(row):
            if calls[i][j] is None:
                continue
            text = "not measured" if v is None else f"{100 * v:.0f}%"
            dark = v is not None and v < 0.6
            ax.text(
                j,
                i,
                f"{text}\n{calls[i][j]} calls",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "black",
            )
    fig.colorbar(im, ax=ax, label="weighted hit ratio (%)")
    ax.set_title("transitions: previous agent -> agent", fontsize=10)
    fig.tight_layout()
    return data_uri(fig)


def latency_stack(breakdown: pa.Table) -> str | None:
    """Each agent's time in the workflows, by component (agent_breakdown; branches summed)."""
    rows = [r for r in _rows(breakdown) if r["path_ms"]]
    if not rows:
        return None
    names = [r["agent_id"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 2.4))
    left = [0.0] * len(rows)
    for c in COMPONENTS:
        widths = [(r[c] or 0) / 1000 for r in rows]
        if not any(widths):
            continue
        ax.barh(names, widths, left=left, color=COMPONENT_COLORS[c], label=COMPONENT_LABELS[c])
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, r in enumerate(rows):
        note = f"  {r['share']:.0%} of workflow time" if r["share"] is not None else ""
        if r["flag"]:
            note += f" ({r['flag']})"
        ax.text(left[i], i, note, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.45)
    ax.set_xlabel("seconds, summed over all workflows")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=4, frameon=False)
    ax.set_title("workflow time per agent", fontsize=10)
    fig.tight_layout()
    return data_uri(fig)


def ttft_scatter(calls: pa.Table, fit: PrefillFit | None, order: AgentOrder = ()) -> str | None:
    """TTFT vs new prefill tokens per successful call, coloured by agent (latency.call_rows)."""
    measured = pc.and_(
        pc.is_valid(calls.column("ttft_ms")), pc.is_valid(calls.column("new_prefill"))
    )
    ok = calls.filter(pc.and_(pc.equal(calls.column("status"), "ok"), measured))
    if not ok.num_rows:
        return None
    agents = pc.fill_null(ok.column("agent_id"), NO_AGENT)
    fig, ax = plt.subplots(figsize=(7, 4))
    for agent in sorted(set(agents.to_pylist()), key=_key(order)):
        mine = ok.filter(pc.equal(agents, agent))
        x, y = (mine.column(c).to_numpy() for c in ("new_prefill", "ttft_ms"))
        ax.scatter(x, y, color=color(agent, order), label=agent, s=22, alpha=0.8)
    if fit is not None:
        xs = [0, pc.max(ok.column("new_prefill")).as_py()]
        label = f"fit of {fit.fit_on}: {fit.intercept_ms:.0f} ms + {fit.ms_per_token:.2f} ms/token"
        ax.plot(
            xs,
            [fit.intercept_ms + fit.ms_per_token * x for x in xs],
            color="#333",
            ls="--",
            lw=1,
            label=label,
        )
    ax.set_xlabel("new prefill tokens (prompt - cached)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("time to first token vs tokens computed", fontsize=10)
    fig.tight_layout()
    return data_uri(fig)


def eviction_heatmap(pairs: pa.Table, order: AgentOrder = ()) -> str | None:
    """Evictor agent x victim agent: blocks evicted, harmful recomputed tokens (eviction_pairs)."""
    rows = _rows(pairs, False)
    if not rows:
        return None
    evictors = sorted({r["evictor_agent_id"] for r in rows}, key=_key(order))
    victims = sorted({r["victim_agent_id"] for r in rows}, key=_key(order))
    counts = [[0] * len(victims) for _ in evictors]
    for r in rows:
        counts[evictors.index(r["evictor_agent_id"])][victims.index(r["victim_agent_id"])] = r
    values = [[c["evictions"] if c else 0 for c in row] for row in counts]
    top = max(max(row) for row in values)
    fig, ax = plt.subplots(figsize=(1.6 * len(victims) + 2.6, 0.8 * len(evictors) + 1.6))
    im = ax.imshow(values, cmap="Reds", vmin=0, aspect="auto")
    ax.set_xticks(range(len(victims)), victims)
    ax.set_yticks(range(len(evictors)), evictors)
    ax.set_xlabel("victim: agent that stored the block")
    ax.set_ylabel("evictor agent")
    for i, row in enumerate(counts):
        for j, c in enumerate(row):
            if not c:
                continue
            tokens = c["recomputed_tokens"]
            harm = f"\n{c['harmful']} harmful" + (f", {tokens:,} tok" if tokens else "")
            ax.text(
                j,
                i,
                f"{c['evictions']} blocks{harm}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if c["evictions"] > top / 2 else "black",
            )
    fig.colorbar(im, ax=ax, label="blocks evicted")
    ax.set_title("evictions: who evicted whom (harmful = recomputed later)", fontsize=10)
    fig.tight_layout()
    return data_uri(fig)


def capacity_lines(
    sweep: pa.Table, losses: Sequence[ReuseLoss], order: AgentOrder = ()
) -> str | None:
    """Per-agent hit ratio vs KV capacity (pressure_sweep): a line per agent, and a line style
    per concurrency and group (runs that differ in other settings)."""
    rows = [
        r
        for r in _rows(sweep)
        if r["kv_capacity_tokens"] is not None and r["weighted_hit_ratio"] is not None
    ]
    capacities = sorted({r["kv_capacity_tokens"] for r in rows})
    if len(capacities) < 2:
        return None
    series = sorted(
        {(r["concurrency"], r.get("group")) for r in rows},
        key=lambda k: (k[0] is None, k[0] or 0, k[1] or ""),
    )
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    for k, (conc, group) in enumerate(series):
        for agent in sorted({r["agent_id"] for r in rows}, key=_key(order)):
            line = [
                r
                for r in rows
                if (r["agent_id"], r["concurrency"], r.get("group")) == (agent, conc, group)
            ]
            pts = sorted((at, 100 * v) for at, v in pooled(line, "kv_capacity_tokens").items())
            if not pts:
                continue
            label = ", ".join(
                [agent]
                + ([f"concurrency {conc}"] if len({c for c, _ in series}) > 1 else [])
                + ([group] if group else [])
            )
            ax.plot(
                *zip(*pts, strict=True),
                marker="o",
                color=color(agent, order),
                label=label,
                ls=styles[k % len(styles)],
            )
    for loss in losses:
        ax.annotate(
            f"{loss.agent_id} loses reuse first",
            (loss.at, 100 * loss.ratio),
            xytext=(-30, -28),
            textcoords="offset points",
            fontsize=8,
            ha="right",
            arrowprops={"arrowstyle": "->", "color": "#333"},
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(capacities, [f"{c:,}" for c in capacities])
    ax.minorticks_off()
    ax.invert_xaxis()  # pressure grows to the right
    ax.set_xlabel("KV capacity in tokens (log scale; less capacity to the right)")
    ax.set_ylabel("weighted hit ratio (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("reuse as KV capacity shrinks", fontsize=10)
    fig.tight_layout()
    return data_uri(fig)
