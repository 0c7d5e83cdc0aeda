"""The timeline's call lanes: polygons for a run a person can read call by call, one image past
MAX_BARS calls (a 100k-call run drew for minutes as a patch per call)."""

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb

from kvscope.report import timeline

AGENTS = ("planner", "executor")


def calls(workflows: int, per: int, fail_every: int = 0) -> list[dict[str, Any]]:
    rows = []
    for w in range(workflows):
        for k in range(per):
            start = 10**9 * (w + 2 * k)
            failed = fail_every and k % fail_every == 0
            status = "error" if failed else "ok"
            rows.append({"start_ns": start, "end_ns": start + 10**9, "thread_id": f"t-{w}",
                         "agent_id": AGENTS[k % 2], "status": status})  # fmt: skip
    return rows


def lanes_of(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({r["thread_id"] for r in rows}, key=timeline._natural)


def test_few_calls_are_one_polygon_each_in_their_lane_and_colour() -> None:
    rows = calls(12, 3, fail_every=3)
    fig, ax = plt.subplots()
    timeline._bars(ax, rows, lanes_of(rows), AGENTS, lambda t: t / 1e9)
    polys = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert sum(len(c.get_paths()) for c in polys) == len(rows)
    by_style = {(tuple(np.round(c.get_facecolor()[0][:3], 3)), c.get_hatch()): c for c in polys}
    planner = to_rgb(timeline.agent_color("planner", AGENTS))
    failed = by_style[(tuple(np.round(planner, 3)), "xx")]  # k = 0: the planner's, failed
    assert len(failed.get_paths()) == 12
    # t-10 is lane 10 (numbers by value, not t-10 before t-2): its failed call spans 10..11 s
    corners = failed.get_paths()[10].vertices
    assert corners[:, 0].min() == pytest.approx(10) and corners[:, 0].max() == pytest.approx(11)
    assert (corners[:, 1].min(), corners[:, 1].max()) == pytest.approx((9.65, 10.35))
    plt.close(fig)


def test_past_max_bars_the_calls_are_one_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "MAX_BARS", 50)
    rows = calls(40, 4, fail_every=4)  # 160 calls
    fig, ax = plt.subplots()
    timeline._bars(ax, rows, lanes_of(rows), AGENTS, lambda t: t / 1e9)
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]
    (image,) = ax.images
    pixels = np.asarray(image.get_array())
    assert pixels.shape == (40, timeline.RASTER_WIDTH, 3)  # a row per lane, under RASTER_ROWS
    x0, x1 = image.get_extent()[:2]
    assert (x0, x1) == (0, 46)  # the first call's start to the last call's end, in seconds

    def pixel(lane: int, second: float) -> tuple[float, ...]:
        col = int((second - x0) / (x1 - x0) * (timeline.RASTER_WIDTH - 1))
        return tuple(pixels[lane, col])

    executor = to_rgb(timeline.agent_color("executor", AGENTS))
    assert pixel(5, 5 + 2 + 0.5) == executor  # lane 5's second call (k = 1), mid-call
    assert pixel(5, 5 + 0.5) == to_rgb(timeline.FAILED_COLOR)  # its first, failed
    assert pixel(5, 5 + 1.5) == (1.0, 1.0, 1.0)  # between the two: nothing
    plt.close(fig)


def test_a_large_run_plots_in_seconds_not_minutes(tmp_path: Path) -> None:
    rows = calls(2000, 12)  # 24,000 calls: past MAX_BARS
    path = timeline.plot(rows, {}, tmp_path / "t.png", "large")
    assert path.stat().st_size > 0
