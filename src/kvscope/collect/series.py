"""Pure helpers over sampled series: counter increases across resets, nearest-sample lookups."""

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

Points = Sequence[tuple[int, float]]  # (timestamp_ns, value), sorted by time
K = TypeVar("K", bound=Hashable)


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


def from_first_scrape(series: Mapping[str, Points], counters: Iterable[str]) -> dict[str, Points]:
    """`counters`' points in a run's instant series (kvscope name -> points), each from the run's
    first scrape: a counter first seen after it gets a 0 at it. A counter never seen is left out
    (its increase is None: not exposed, never 0).

    A counter counts from 0 at its creation, and an engine creates a labelled one at its first
    increment. Where the exposition leaves out a family with no sample yet, as prometheus_client's
    multiprocess mode does (SGLang's /metrics: no `sglang:cached_tokens_total` at all before the
    first cache hit), the scrape has nothing to read, and a delta from the first value seen would
    drop that value (a live run's cached tokens "differed by -381", its first call's hit). A single
    scrape cannot tell "not yet counted" from "not exposed"; a later scrape of the same engine
    that has it can. The run's first scrape is the earliest point of any series (every successful
    scrape gives some instant value: capacity, usage, running requests).
    """
    starts = [points[0][0] for points in series.values() if points]
    if not starts:
        return {}
    first = min(starts)
    out: dict[str, Points] = {}
    for name in counters:
        points = series.get(name)
        if points:
            out[name] = points if points[0][0] <= first else [(first, 0.0), *points]
    return out


def series_deltas(
    rows: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], K | None]
) -> dict[K, float | None]:
    """Each series' increase over a run, from metrics.parquet rows; `key` names a row's series
    (include its labels) or skips it (None). None for a series none of whose values is known
    (never 0: an unmeasured counter is not a counter that stayed still).

    A series first seen after the run's first scrape started at 0: engines create a labelled
    counter at its first increment.
    """
    points: dict[K, list[tuple[int, float]]] = defaultdict(list)
    first: int | None = None  # the first scrape of all
    for row in rows:
        first = row["timestamp_ns"] if first is None else min(first, row["timestamp_ns"])
        k = key(row)
        if k is not None:
            points[k].append((row["timestamp_ns"], row["value"]))
    out: dict[K, float | None] = {}
    for k, pts in points.items():
        pts.sort()
        if first is not None and pts[0][0] > first:
            pts.insert(0, (first, 0.0))
        out[k] = counter_delta(v for _, v in pts)
    return out


def histogram_part(metric_name: str) -> str | None:
    """ "sum" or "count" for a Prometheus histogram's running sum / count sample, else None."""
    part = metric_name.rsplit("_", 1)[-1]
    return part if part in ("sum", "count") else None


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
