"""Pure helpers over sampled series: counter increases across resets, nearest-sample lookups."""

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Literal

Points = Sequence[tuple[int, float]]  # (timestamp_ns, value), sorted by time


def counter_delta(values: Iterable[float | None]) -> float | None:
    """A counter's increase over values in time order; None when there is no value.

    A decrease is a counter reset (the engine restarted): the counter started again from 0, so
    the value after the reset is all it gained since. Unknown (None, NaN) values are skipped.
    """
    delta, last = 0.0, None
    for v in values:
        if v is None or math.isnan(v):
            continue
        if last is not None:
            delta += v - last if v >= last else v
        last = v
    return None if last is None else delta


def nearest(points: Points, t_ns: int, side: Literal["before", "after"] = "before") -> float | None:
    """The value at or before (side="before") / at or after ("after") t_ns; None if none."""
    if side == "before":
        i = bisect.bisect_right(points, t_ns, key=_time) - 1
        return points[i][1] if i >= 0 else None
    if side == "after":
        i = bisect.bisect_left(points, t_ns, key=_time)
        return points[i][1] if i < len(points) else None
    raise ValueError(f"side must be 'before' or 'after', not {side!r}")


def _time(point: tuple[int, float]) -> int:
    return point[0]
