"""Do kvscope's per-request numbers agree with the engine's own counters? Shown, never hidden."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kvscope.collect.series import Points, from_first_scrape

# kvscope counter name -> the request-table column it should equal the sum of
PAIRS = {"cached_tokens_total": "cached_tokens", "prompt_tokens_total": "prompt_tokens"}
EVICTED = "evicted_tokens_total"  # checked against the KV events' evicted blocks (evictions)


@dataclass(frozen=True)
class Reconciliation:
    counter: str
    requests_sum: int | None  # over the rows where the column was measured
    engine_delta: float | None  # the counter's increase over the run (resets handled)
    unmeasured_rows: int  # rows whose column is null (failed calls, engines that don't report)
    replica: str | None = None  # a deployment's replica: its counters vs the calls it served
    source: str = "requests"  # what kvscope's side sums: the request rows, or the KV events

    @property
    def difference(self) -> float | None:
        if self.requests_sum is None or self.engine_delta is None:
            return None
        return self.engine_delta - self.requests_sum

    @property
    def exact(self) -> bool | None:
        diff = self.difference
        return None if diff is None else diff == 0

    def to_dict(self) -> dict[str, Any]:
        """summary.json's entry: the fields and the difference; `replica` only for a replica,
        `source` only where it is not the request rows."""
        out = asdict(self) | {"difference": self.difference}
        if self.replica is None:
            del out["replica"]
        if self.source == "requests":
            del out["source"]
        return out


def reconcile(
    rows: Sequence[dict[str, Any]],
    counters: dict[str, Sequence[float]],
    delta: Callable[[Iterable[float]], float | None],
    replica: str | None = None,
) -> list[Reconciliation]:
    """`counters`: each kvscope counter's values over the run, in time order; `rows`: the calls
    those counters counted (a replica's: the calls placed on it)."""
    out = []
    for counter, column in PAIRS.items():
        known = [r[column] for r in rows if r.get(column) is not None]
        values = counters.get(counter)
        out.append(
            Reconciliation(
                counter=counter,
                requests_sum=sum(known) if known else None,
                engine_delta=delta(values) if values else None,
                unmeasured_rows=len(rows) - len(known),
                replica=replica,
            )
        )
    return out


def counter_values(series: Mapping[str, Points]) -> dict[str, Sequence[float]]:
    """reconcile's `counters` from a run's instant series (kvscope name -> points): each counter's
    values from the run's first scrape, where one first seen later had counted 0 (an engine
    creates a labelled counter at its first increment: collect.series.from_first_scrape)."""
    return {k: [v for _, v in pts] for k, pts in from_first_scrape(series, PAIRS).items()}


def evictions(
    blocks: pa.Table | None,
    series: Mapping[str, Points],
    delta: Callable[[Iterable[float]], float | None],
) -> Reconciliation | None:
    """The tokens of the blocks the KV events say were evicted during the run against the
    engine's own eviction counter (SGLang's `sglang:evicted_tokens_total`); None where either
    side is missing (no KV events; vLLM 0.32 has no such counter)."""
    points = from_first_scrape(series, [EVICTED]).get(EVICTED)
    if blocks is None or not points:
        return None
    removed = pc.fill_null(pc.equal(blocks.column("removal"), "evicted"), False)
    evicted = pc.sum(blocks.column("tokens").filter(removed)).as_py() or 0
    return Reconciliation(EVICTED, evicted, delta(v for _, v in points), 0, source="kv_events")
