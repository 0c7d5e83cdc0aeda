"""Where a run's first-token and call time went, between the client, the engine's front end and
its core.

Three clocks see each call: the client (ttft_ms, e2e_ms in the request table); the engine's front
end, from a request's arrival (its TTFT and e2e histograms on /metrics); the engine's core, per
request (queue_ms, prefill_ms, decode_ms). Summed over the run:

    client TTFT = engine TTFT + client side   (network, the client's own process)
    engine TTFT = core queue + core prefill + front end   (templating, tokenizing, IPC, output)

and the same for e2e with the core's decode added. An engine's histograms cover every request it
finished while the run was sampled, so the sums are split only when the engine counted exactly the
table's measured rows; otherwise the split is null and the counts say why.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvscope.collect.series import histogram_part, series_deltas
from kvscope.records.requests import STATUS_OK

# span -> (engine histogram, client column, the core's per-request parts)
SPANS = {
    "ttft": ("ttft_seconds", "ttft_ms", ("queue_ms", "prefill_ms")),
    "e2e": ("e2e_seconds", "e2e_ms", ("queue_ms", "prefill_ms", "decode_ms")),
}


@dataclass(frozen=True)
class TimeSplit:
    span: str  # "ttft" | "e2e"
    rows: int  # successful rows with the client's measure
    engine_requests: int | None  # the engine histogram's count over the run
    client_ms: float | None  # the client's sum over those rows
    engine_ms: float | None  # the engine front end's sum over the requests it counted
    core_ms: float | None  # the core's parts summed over the rows; None if a row lacks one

    @property
    def matched(self) -> bool:
        return self.engine_requests is not None and self.engine_requests == self.rows

    @property
    def client_side_ms(self) -> float | None:
        if not self.matched or self.client_ms is None or self.engine_ms is None:
            return None
        return self.client_ms - self.engine_ms

    @property
    def front_end_ms(self) -> float | None:
        if not self.matched or self.engine_ms is None or self.core_ms is None:
            return None
        return self.engine_ms - self.core_ms

    def to_dict(self) -> dict[str, Any]:
        """The split with its derived parts, for summary.json."""
        return asdict(self) | {
            "matched": self.matched,
            "client_side_ms": self.client_side_ms,
            "front_end_ms": self.front_end_ms,
        }


def histogram_sums(
    series: Iterable[Mapping[str, Any]],
) -> dict[str, tuple[float | None, float | None]]:
    """kvscope latency name -> (count, sum in ms) over the run, summed over label sets; a part
    is None when one of its series has no known value."""

    def key(row: Mapping[str, Any]) -> tuple[str, str, str] | None:
        name, part = row.get("kvscope_name"), histogram_part(row["metric_name"])
        if name is None or not name.endswith("_seconds") or part is None:
            return None
        return name, part, row["labels"]

    parts: dict[tuple[str, str], float | None] = {}
    for (name, part, _), delta in series_deltas(series, key).items():
        before = parts.get((name, part), 0.0)
        parts[(name, part)] = None if before is None or delta is None else before + delta
    out: dict[str, tuple[float | None, float | None]] = {}
    for (name, part), count in parts.items():
        if part == "count" and (name, "sum") in parts:
            total = parts[(name, "sum")]
            out[name] = (count, None if total is None else total * 1000)
    return out


def time_split(
    rows: Sequence[Mapping[str, Any]], series: Iterable[Mapping[str, Any]]
) -> list[TimeSplit]:
    """One split per span the engine's histograms cover; `series`: metrics.parquet rows."""
    engine = histogram_sums(series)
    ok = [r for r in rows if r.get("status") == STATUS_OK]
    out = []
    for span, (histogram, column, core_parts) in SPANS.items():
        if histogram not in engine:
            continue
        measured = [r for r in ok if r.get(column) is not None]
        count, engine_ms = engine[histogram]
        complete = all(r.get(c) is not None for r in measured for c in core_parts)
        out.append(
            TimeSplit(
                span=span,
                rows=len(measured),
                engine_requests=None if count is None else round(count),
                client_ms=sum(r[column] for r in measured) if measured else None,
                engine_ms=engine_ms if count else None,
                core_ms=sum(r[c] for r in measured for c in core_parts)
                if measured and complete
                else None,
            )
        )
    return out
