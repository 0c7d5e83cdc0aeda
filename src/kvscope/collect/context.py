"""Per-request server context: the cache and queue state around each call, from /metrics samples.

Under concurrency these are context, not ownership: the cache used before and after a call
includes every other request in flight.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SERIES = ("kv_used_tokens", "kv_usage", "running_requests", "queued_requests")  # what they use
COLUMNS = (
    "cache_used_tokens_before", "cache_used_tokens_after", "cache_utilization_before",
    "cache_utilization_after", "running_requests", "queued_requests",
)  # fmt: skip


def context_columns(
    starts: Sequence[int], ends: Sequence[int], series: Mapping[str, Sequence[tuple[int, float]]]
) -> dict[str, list[Any]]:
    """Per call (its start and end, ns): the before/after cache and queue columns, from the
    sample at or before its start / at or after its end (collect.series.nearest's rule), None
    where there is none; for all calls at once (a bisect per call and column took ~2 s at
    100k calls)."""
    start, end = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    picks = (
        ("kv_used_tokens", start, "right", True), ("kv_used_tokens", end, "left", True),
        ("kv_usage", start, "right", False), ("kv_usage", end, "left", False),
        ("running_requests", start, "right", True), ("queued_requests", start, "right", True),
    )  # fmt: skip
    out: dict[str, list[Any]] = {}
    for column, (name, t, side, whole) in zip(COLUMNS, picks, strict=True):
        points = series.get(name, ())
        times = np.fromiter((p[0] for p in points), dtype=np.int64, count=len(points))
        at = np.searchsorted(times, t, side=side) - (side == "right")
        values = [points[i][1] if 0 <= i < len(points) else None for i in at.tolist()]
        out[column] = [None if v is None else round(v) for v in values] if whole else values
    return out


SERVER_TIMINGS = ("queue_ms", "prefill_ms", "decode_ms")  # an engine's own per-request timing
