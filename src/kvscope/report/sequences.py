"""The predictability section of a run's report (analysis.predictability): the agent sequences as a
transition graph, reuse distance per agent, and the next-agent predictor's accuracy.

The figure has three panels: the step-edge graph (nodes at the earliest step the agent ran at,
arrows as thick as they are frequent, labelled with their count; arrows going back curve), and
box plots of the reuse distance per agent in steps and in seconds.
"""

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt
import pyarrow as pa

from kvscope.analysis.predictability import START, VALUES, Predictability, ReuseDistance
from kvscope.records.agents import AgentOrder
from kvscope.report.columns import COLUMNS
from kvscope.report.plots import data_uri
from kvscope.report.prose import say
from kvscope.report.table import Section, Table, table
from kvscope.report.timeline import agent_color

SEPARATOR = " > "
TITLE = "Next-agent predictability"


def tables(p: Predictability) -> list[Table]:
    """The distinct sequences, reuse distance per agent, the predictor's accuracy."""
    seqs = pa.Table.from_pylist(
        [
            {
                "sequence": SEPARATOR.join(s.sequence),
                "workflows": s.workflows,
                "workflow_share": s.workflows / p.workflows,
            }
            for s in p.sequences
        ]
    )
    reuse = pa.Table.from_pylist(
        [{k: v for k, v in r.__dict__.items() if k not in VALUES} for r in p.reuse]
    )
    rows = [*p.accuracy, *([p.longer] if p.longer else [])]
    acc = pa.Table.from_pylist([a.__dict__ for a in rows])
    return [
        table(seqs, COLUMNS["sequences"], "distinct agent sequences (one per workflow run)"),
        table(reuse, COLUMNS["reuse"], "reuse distance: until the agent's next visit"),
        table(
            acc,
            COLUMNS["accuracy"],
            f"next-agent predictor (last {p.history} agent, from earlier workflows)",
        ),
    ]


def section(p: Predictability, order: AgentOrder) -> Section:
    """The report section; without a workflow (no graph ran) it says so."""
    intro = say("predictability_intro")
    if not p.workflows:
        return Section("predictability", TITLE, intro, None, say("predictability_missing"))
    return Section(
        "predictability",
        TITLE,
        intro,
        figure(p, order),
        say("predictability_missing"),
        tables(p),
        [say("predictability_summary", p, SEPARATOR.join(p.sequences[0].sequence))],
    )


def _layout(p: Predictability, order: AgentOrder) -> dict[str, tuple[float, float]]:
    """Node positions: x = the agent's earliest position-distance from start along the step
    edges (breadth-first), y = its place among the agents of that x."""
    depth = {START: 0}
    frontier = [START]
    while frontier:
        nxt = []
        for a in frontier:
            for (f, t), _ in sorted(p.edges.items()):
                if f == a and t not in depth:
                    depth[t] = depth[a] + 1
                    nxt.append(t)
        frontier = nxt
    rank = {a: i for i, a in enumerate(order)}
    pos = {}
    for x in sorted(set(depth.values())):
        column = sorted((a for a, d in depth.items() if d == x), key=lambda a: rank.get(a, -1))
        for y, a in enumerate(column):
            pos[a] = (float(x), (len(column) - 1) / 2 - y)
    return pos


def _graph(ax: plt.Axes, p: Predictability, order: AgentOrder) -> None:
    pos = _layout(p, order)
    top = max(p.edges.values(), default=1)
    for (f, t), n in p.edges.items():
        (x0, y0), (x1, y1) = pos[f], pos[t]
        back = x1 <= x0
        ax.annotate(
            "", (x1, y1), (x0, y0),
            arrowprops={"arrowstyle": "-|>", "lw": 0.6 + 3 * n / top, "color": "#888",
                        "shrinkA": 16, "shrinkB": 16,
                        "connectionstyle": f"arc3,rad={0.45 if back else 0.08}"},
        )  # fmt: skip
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2 + (0.3 if back else 0.08)
        ax.text(mx, my, str(n), fontsize=7, ha="center", color="#555")
    for a, (x, y) in pos.items():
        c = "#ddd" if a == START else agent_color(a, order)
        ax.scatter([x], [y], s=700, color=c, zorder=3, edgecolor="white")
        ax.text(x, y - 0.32, a, ha="center", va="top", fontsize=8)
    xs, ys = [x for x, _ in pos.values()], [y for _, y in pos.values()]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 1, max(ys) + 1)
    ax.set_title("agent sequences: step edges (count)", fontsize=10)
    ax.axis("off")


def _boxes(ax: plt.Axes, reuse: Sequence[ReuseDistance], attr: str, order: AgentOrder) -> None:
    data = [(r.agent_id, getattr(r, attr)) for r in reuse if getattr(r, attr)]
    if not data:
        ax.text(0.5, 0.5, "no agent came back", ha="center", va="center",
                transform=ax.transAxes, color="#999")  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        parts = ax.boxplot([list(v) for _, v in data], orientation="horizontal", patch_artist=True)
        for box, (a, _) in zip(parts["boxes"], data, strict=True):
            box.set_facecolor(agent_color(a, order))
        ax.set_yticks(range(1, len(data) + 1), [a for a, _ in data], fontsize=8)
        ax.invert_yaxis()
    unit = "steps (visits)" if attr == "steps" else "seconds"
    ax.set_xlabel(f"{unit} to the agent's next visit")
    ax.set_title(f"reuse distance ({attr})", fontsize=10)


def figure(p: Predictability, order: AgentOrder) -> str | None:
    """The three panels as a data URI; None without step edges."""
    if not p.edges:
        return None
    agents = len({a for e in p.edges for a in e})
    fig, (graph, steps, secs) = plt.subplots(
        1, 3, figsize=(14, max(3.6, 0.7 * agents)), width_ratios=(2.2, 1, 1)
    )
    _graph(graph, p, order)
    _boxes(steps, p.reuse, "steps", order)
    _boxes(secs, p.reuse, "seconds", order)
    fig.tight_layout()
    return data_uri(fig)
