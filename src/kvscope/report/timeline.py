"""KV usage and running/queued requests over time, with every agent call drawn on the same axis."""

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb

from kvscope.records.agents import AgentOrder, agent_key, agent_order

# An agent's colour: PALETTE by its place in the run's agent order (first appearance), so a
# PEER run's planner, executor, expresser and reviewer keep blue, orange, green and red; an
# agent outside the order (or past the palette): one of PALETTE by a hash of its name.
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
           "#8C8C8C", "#CCB974", "#64B5CD", "#2a9d8f", "#e76f51", "#264653", "#b5838d")  # fmt: skip
NO_AGENT_COLOR = "#777"
NO_THREAD = "(no thread)"
MAX_LANE_LABELS = 40  # more workflows than this: their lanes are drawn unnamed, without edges
MAX_BARS = 20_000  # more calls than this: drawn as one image (RASTER_WIDTH x RASTER_ROWS at most)
RASTER_WIDTH, RASTER_ROWS = 1200, 600
FAILED_COLOR = "#111"


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
CALL_COLUMNS = ("start_ns", "end_ns", "thread_id", "agent_id", "status", "replica")


def call_rows(requests: pa.Table) -> list[dict[str, Any]]:
    """The request table's rows as `plot` and a replica's filter read them: only CALL_COLUMNS
    (those the table has; a 100k-call run's 69 columns as dicts took ~1.5 s)."""
    return requests.select([c for c in CALL_COLUMNS if c in requests.column_names]).to_pylist()


def plot(rows: Sequence[dict[str, Any]], series: Series, path: Path, title: str) -> Path:
    """Three stacked panels sharing a time axis (seconds from the first call or sample)."""
    starts = [r["start_ns"] for r in rows] + [t for pts in series.values() for t, _ in pts[:1]]
    t0 = min(starts) if starts else 0

    def secs(t_ns: int) -> float:
        return (t_ns - t0) / 1e9

    lanes = sorted({r["thread_id"] or NO_THREAD for r in rows}, key=_natural)
    order = agent_order(rows)
    fig, (kv, queue, calls) = plt.subplots(
        3,
        1,
        sharex=True,
        figsize=(11, 7.5),
        height_ratios=(2, 1, min(max(1.5, 0.35 * len(lanes)), 6)),
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
    _bars(calls, rows, lanes, order, secs)
    if len(lanes) <= MAX_LANE_LABELS:
        calls.set_yticks(range(len(lanes)), [lane.rsplit("-", 1)[-1] for lane in lanes],
                         fontsize=8)  # fmt: skip
    else:  # one lane per workflow, too many to name: a band of calls
        calls.set_yticks([])
    calls.set_ylabel("workflow" if len(lanes) <= MAX_LANE_LABELS else f"{len(lanes):,} workflows")
    calls.set_xlabel("seconds")
    agents = sorted({r["agent_id"] for r in rows if r["agent_id"]}, key=agent_key(order))
    handles = [plt.Rectangle((0, 0), 1, 1, color=agent_color(a, order)) for a in agents]
    calls.legend(handles, agents, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                 ncols=min(len(agents), 6) or 1, frameon=False)  # above the lanes  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(
    calls: Any,
    rows: Sequence[dict[str, Any]],
    lanes: list[str],
    order: AgentOrder,
    secs: Callable[[int], float],
) -> None:
    """Every call as a bar in its workflow's lane, coloured by agent, hatched when it failed:
    one PolyCollection per colour and status (a bar per call as a patch of its own took ~1 ms
    each: minutes for a 100k-call run); past MAX_BARS calls, one image of the lanes (`_raster`:
    drawing that many polygons took ~7 s)."""
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    groups: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    for r in rows:
        end = r["end_ns"] if r["end_ns"] > r["start_ns"] else r["start_ns"] + 1
        key = (agent_color(r["agent_id"], order), r["status"] != "ok")
        y = lane_of[r["thread_id"] or NO_THREAD]
        groups.setdefault(key, []).append((y, secs(r["start_ns"]), secs(end)))
    if not rows:
        return
    if len(rows) > MAX_BARS:
        _raster(calls, {k: np.array(v) for k, v in groups.items()}, len(lanes))
        return
    few = len(lanes) <= MAX_LANE_LABELS
    for (color, failed), bars in groups.items():
        y, x0, x1 = np.array(bars).T
        low, high = y - 0.35, y + 0.35
        verts = np.stack([np.stack(corner, axis=-1) for corner in
                          ((x0, low), (x1, low), (x1, high), (x0, high))], axis=1)  # fmt: skip
        calls.add_collection(PolyCollection(
            verts, facecolors=color, edgecolors="white" if few else color,
            linewidths=0.5 if few else 0, hatch="xx" if failed else None,
        ))  # fmt: skip
    calls.set_ylim(-0.5, len(lanes) - 0.5)
    calls.autoscale_view(scaley=False)


def _raster(calls: Any, groups: Mapping[tuple[str, bool], Any], n_lanes: int) -> None:
    """The calls as one image, RASTER_WIDTH columns over the run's time and a row per lane (or
    per band of lanes, at most RASTER_ROWS): a pixel takes the colour of a call over it, failed
    calls drawn last in FAILED_COLOR."""
    x_min = min(float(b[:, 1].min()) for b in groups.values())
    x_max = max(float(b[:, 2].max()) for b in groups.values())
    span = (x_max - x_min) or 1.0
    rows = min(n_lanes, RASTER_ROWS)
    image = np.ones((rows, RASTER_WIDTH, 3))
    for (color, failed), bars in sorted(groups.items(), key=lambda kv: kv[0][1]):
        rgb = to_rgb(FAILED_COLOR if failed else color)
        lane = (bars[:, 0] * rows // n_lanes).astype(int)
        first = ((bars[:, 1] - x_min) / span * (RASTER_WIDTH - 1)).astype(int)
        last = ((bars[:, 2] - x_min) / span * (RASTER_WIDTH - 1)).astype(int)
        for y, a, b in zip(lane.tolist(), first.tolist(), last.tolist(), strict=True):
            image[y, a : b + 1] = rgb
    calls.imshow(image, aspect="auto", origin="lower", interpolation="nearest",
                 extent=(x_min, x_max, -0.5, n_lanes - 0.5))  # fmt: skip
    if any(failed for _, failed in groups):
        calls.text(0.99, 0.02, "failed calls in black", transform=calls.transAxes, ha="right",
                   fontsize=8, color=FAILED_COLOR)  # fmt: skip


def _natural(name: str) -> list[tuple[int, int | str]]:
    """A sort key that puts `load-2` before `load-10` (numbers by value)."""
    return [(1, int(part)) if part.isdigit() else (0, part) for part in re.split(r"(\d+)", name)]


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
