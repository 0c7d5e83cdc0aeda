"""Per-request server context: the cache and queue state around each call, from /metrics samples.

Under concurrency these are context, not ownership: the cache used before and after a call
includes every other request in flight.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvscope.collect.series import nearest
from kvscope.records.requests import RequestRecord

COLUMNS = (
    "cache_used_tokens_before", "cache_used_tokens_after", "cache_utilization_before",
    "cache_utilization_after", "running_requests", "queued_requests",
)  # fmt: skip


def context_columns(
    row: Mapping[str, Any], series: Mapping[str, Sequence[tuple[int, float]]]
) -> dict[str, Any]:
    """A row's before/after cache and queue columns, from the samples nearest its start and end
    (None where no sample is near); finalize sets them on its rows in place."""
    start, end = row["start_ns"], row["end_ns"]
    used, usage = series.get("kv_used_tokens", ()), series.get("kv_usage", ())

    def as_int(v: float | None) -> int | None:
        return None if v is None else round(v)

    values = (
        as_int(nearest(used, start, "before")),
        as_int(nearest(used, end, "after")),
        nearest(usage, start, "before"),
        nearest(usage, end, "after"),
        as_int(nearest(series.get("running_requests", ()), start, "before")),
        as_int(nearest(series.get("queued_requests", ()), start, "before")),
    )
    return dict(zip(COLUMNS, values, strict=True))


def with_server_timings(
    record: RequestRecord, timings: Mapping[str, float | None] | None
) -> RequestRecord:
    """queue_ms / prefill_ms / decode_ms from the engine's own per-request timing, if any."""
    if not timings:
        return record
    keys = ("queue_ms", "prefill_ms", "decode_ms")
    return replace(record, **{k: timings.get(k) for k in keys if timings.get(k) is not None})
