"""KV usage and running/queued requests over time, with every agent call drawn on the same axis."""

import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt

from kvscope.analysis.agents import AgentOrder, agent_key, agent_order

# An agent's colour: PALETTE by its place in the run's agent order (first appearance), so a
# PEER run's planner, executor, expresser and reviewer keep blue, orange, green and red; an
# agent outside the order (or past the palette): one of PALETTE by a hash of its name.
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
           "#8C8C8C", "#CCB974", "#64B5CD", "#2a9d8f", "#e76f51", "#264653", "#b5838d")  # fmt: skip
NO_AGENT_COLOR = "#777"
NO_THREAD = "(no thread)"


def agent_color(agent: str | None, order: AgentOrder = ()) -> str:
    """The colour of an agent in every figure of a run: PALETTE[its index in `order`] (the run's
    agents.agent_order), else a hash of its name; calls of no agent are grey."""
    if agent is None:
        return NO_AGENT_COLOR
    agents = [a for a in order if a is not None]
    if agent in agents and agents.index(agent) < len(PALETTE):
        return PALETTE[agents.index(agent)]
    return PALETTE[zlib.crc32(agent.encode()) % len(PALETTE)]


Series = Mapping[str, Sequence[tuple[int, float]]]


def plot(rows: Sequence[dict[str, Any]], series: Series, path: Path, title: str) -> Path:
    """Three stacked panels sharing a time axis (seconds from the first call or sample)."""
    starts = [r["start_ns"] for r in rows] + [t for pts in series.values() for t, _ in pts[:1]]
    t0 = min(starts) if starts else 0

    def secs(t_ns: int) -> float:
        return (t_ns - t0) / 1e9

    lanes = sorted({r["thread_id"] or NO_THREAD for r in rows})
    order = agent_order(rows)
    fig, (kv, queue, calls) = plt.subplots(
        3, 1, sharex=True, figsize=(11, 7.5), height_ratios=(2, 1, max(1.5, 0.35 * len(lanes)))
    )
    used = series.get("kv_used_tokens", ())
    if used:
        kv.plot([secs(t) for t, _ in used], [v for _, v in used], color="#333", lw=1.2,
                label="KV cache used")  # fmt: skip
    _evictable(kv, series, secs)
    cap = series.get("kv_capacity_tokens", ())
    if cap:
        kv.axhline(cap[-1][1], color="#999", ls="--", lw=1, label=f"capacity {cap[-1][1]:,.0f}")
    kv.set_ylabel("tokens")
    kv.set_title(title, loc="left", fontsize=11)
    _legend_or_note(kv)
    for name, color in (("running_requests", "#2a9d8f"), ("queued_requests", "#e76f51")):
        pts = series.get(name, ())
        if pts:
            queue.step([secs(t) for t, _ in pts], [v for _, v in pts], where="post",
                       color=color, label=name.replace("_", " "))  # fmt: skip
    queue.set_ylabel("requests")
    _legend_or_note(queue)
    for r in rows:
        lane = lanes.index(r["thread_id"] or NO_THREAD)
        end = r["end_ns"] if r["end_ns"] > r["start_ns"] else r["start_ns"] + 1
        color = agent_color(r["agent_id"], order)
        hatch = None if r["status"] == "ok" else "xx"
        calls.barh(lane, secs(end) - secs(r["start_ns"]), left=secs(r["start_ns"]), height=0.7,
                   color=color, edgecolor="white", hatch=hatch)  # fmt: skip
    calls.set_yticks(range(len(lanes)), [lane.rsplit("-", 1)[-1] for lane in lanes], fontsize=8)
    calls.set_ylabel("workflow")
    calls.set_xlabel("seconds")
    agents = sorted({r["agent_id"] for r in rows if r["agent_id"]}, key=agent_key(order))
    handles = [plt.Rectangle((0, 0), 1, 1, color=agent_color(a, order)) for a in agents]
    calls.legend(handles, agents, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                 ncols=min(len(agents), 6) or 1, frameon=False)  # above the lanes  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _legend_or_note(ax: plt.Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8)
    else:  # say so instead of leaving an empty panel
        ax.text(0.5, 0.5, "no /metrics samples", ha="center", va="center",
                transform=ax.transAxes, color="#999")  # fmt: skip


def _evictable(kv: Any, series: Series, secs: Callable[[int], float]) -> None:
    """Cached tokens no running request holds (SGLang's radix tree), stacked on the used ones:
    together they are what the pool holds; the engine evicts from the evictable part."""
    evictable = dict(series.get("kv_evictable_tokens", ()))
    used = dict(series.get("kv_used_tokens", ()))
    at = [t for t in sorted(evictable) if t in used]
    if not at:
        return
    low = [used[t] for t in at]
    high = [used[t] + evictable[t] for t in at]
    kv.fill_between([secs(t) for t in at], low, high, color="#8ab6d6", alpha=0.5,
                    label="cached, evictable (no running request)")  # fmt: skip
