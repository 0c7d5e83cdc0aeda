"""The split of a run's summed TTFT and call time between the client, the engine's front end and
its core, on hand-made rows and series with known answers."""

import json
from typing import Any

import pytest

from kvscope.analysis.time_split import histogram_sums, time_split

LABELS = [{"engine": "0", "model_name": "m"}, {"engine": "1", "model_name": "m"}]


def row(ttft: float | None, e2e: float | None, queue: float | None, prefill: float | None,
        decode: float | None, status: str = "ok") -> dict[str, Any]:  # fmt: skip
    return {"status": status, "ttft_ms": ttft, "e2e_ms": e2e, "queue_ms": queue,
            "prefill_ms": prefill, "decode_ms": decode}  # fmt: skip


ROWS = [
    row(100, 500, 1, 50, 400),
    row(200, 600, 2, 60, 380),
    row(300, 700, 3, 70, 360),
    row(None, None, None, None, None, status="error"),  # a failed call: not in the sums
]


def sample(ts: int, name: str, metric: str, value: float, labels: dict[str, str]) -> dict:
    return {"timestamp_ns": ts, "metric_name": metric, "kvscope_name": name, "value": value,
            "labels": json.dumps(labels, sort_keys=True)}  # fmt: skip


def histogram(name: str, family: str, scrapes: list[tuple[int, list[tuple[float, float]]]]):
    """(timestamp, [(count, sum seconds) per label set]) -> the _count and _sum rows."""
    out = []
    for ts, per_labels in scrapes:
        for labels, (count, total) in zip(LABELS, per_labels, strict=False):
            out.append(sample(ts, name, f"{family}_count", count, labels))
            out.append(sample(ts, name, f"{family}_sum", total, labels))
            out.append(sample(ts, name, f"{family}_bucket", count, labels | {"le": "+Inf"}))
    return out


def series(ttft_count: float = 3) -> list[dict]:
    # two label sets; the counts rise 1 + 2 = 3 (ttft_count) and the sums 0.25 + 0.3 s = 550 ms
    return [
        *histogram("ttft_seconds", "vllm:time_to_first_token_seconds", [
            (10, [(5, 2.0), (1, 1.0)]),
            (20, [(6, 2.25), (1 + ttft_count - 1, 1.3)]),
        ]),
        *histogram("e2e_seconds", "vllm:e2e_request_latency_seconds", [
            (10, [(5, 9.0), (1, 4.0)]),
            (20, [(6, 9.45), (3, 5.3)]),  # +0.45 and +1.3 s = 1,750 ms
        ]),
        sample(15, "kv_usage", "vllm:kv_cache_usage_perc", 0.4, LABELS[0]),
    ]  # fmt: skip


def test_sums_split_into_client_front_end_and_core() -> None:
    ttft, e2e = time_split(ROWS, series())
    assert (ttft.span, ttft.rows, ttft.engine_requests, ttft.matched) == ("ttft", 3, 3, True)
    assert ttft.client_ms == 600
    assert ttft.engine_ms == pytest.approx(550)
    assert ttft.core_ms == 186  # (1 + 50) + (2 + 60) + (3 + 70)
    assert ttft.client_side_ms == pytest.approx(50)
    assert ttft.front_end_ms == pytest.approx(364)
    assert (e2e.span, e2e.client_ms, e2e.core_ms) == ("e2e", 1800, 1326)
    assert e2e.engine_ms == pytest.approx(1750)
    assert e2e.client_side_ms == pytest.approx(50)
    assert e2e.front_end_ms == pytest.approx(424)
    d = ttft.to_dict()
    assert d["client_side_ms"] == pytest.approx(50) and d["matched"] is True


def test_no_split_when_the_engine_counted_other_requests() -> None:
    """A request the table does not have (another client, a call that timed out on our side)
    is in the engine's sums: splitting them would charge it to the run."""
    (ttft, _) = time_split(ROWS, series(ttft_count=4))
    assert (ttft.engine_requests, ttft.rows, ttft.matched) == (4, 3, False)
    assert ttft.client_ms == 600 and ttft.engine_ms is not None
    assert ttft.client_side_ms is None and ttft.front_end_ms is None


def test_a_row_without_a_core_part_leaves_the_front_end_unknown() -> None:
    rows = [*ROWS[:2], row(300, 700, 3, None, 360)]
    ttft, e2e = time_split(rows, series())
    assert ttft.core_ms is None and ttft.front_end_ms is None
    assert ttft.client_side_ms == pytest.approx(50)  # still known
    assert e2e.core_ms is None


def test_a_histogram_first_seen_after_the_first_scrape_started_at_zero() -> None:
    """SGLang creates a labelled histogram at its first observation."""
    late = [
        sample(5, "kv_usage", "vllm:kv_cache_usage_perc", 0.0, LABELS[0]),
        *histogram("ttft_seconds", "x:ttft", [(10, [(2, 0.5)]), (20, [(3, 0.75)])]),
    ]
    assert histogram_sums(late) == {"ttft_seconds": (3, 750)}
    (ttft,) = time_split(ROWS, late)
    assert ttft.engine_requests == 3 and ttft.engine_ms == 750


def test_a_counter_reset_is_handled() -> None:
    rows = histogram("ttft_seconds", "x:ttft", [(10, [(4, 1.0)]), (20, [(1, 0.1)])])
    assert histogram_sums(rows) == {"ttft_seconds": (1, pytest.approx(100))}


def test_nothing_without_the_engines_histograms() -> None:
    assert time_split(ROWS, []) == []
    only_usage = [sample(1, "kv_usage", "vllm:kv_cache_usage_perc", 0.1, LABELS[0])]
    assert time_split(ROWS, only_usage) == []


def test_a_histogram_with_no_known_value_is_unknown_not_zero() -> None:
    """Every scrape of the count was NaN: the engine's request count is not 0, it is unknown."""
    nan = float("nan")
    rows = histogram("ttft_seconds", "x:ttft", [(10, [(nan, 1.0)]), (20, [(nan, 1.5)])])
    assert histogram_sums(rows) == {"ttft_seconds": (None, pytest.approx(500))}
    (ttft,) = time_split(ROWS, rows)
    assert ttft.engine_requests is None and not ttft.matched and ttft.client_side_ms is None
