"""The engine's own side of a run, from its /metrics series: one engine's, or each replica's.

`server_summary(series)` is the run-level summary of one cache's series (peak and mean KV use
and queue, the hit rate from its counters). A deployment has one series per replica
(replicas/<name>/metrics.parquet) and no run-level series: adding two replicas' KV use sample
by sample would invent a cache nobody has. So each replica gets its own summary and its own
reconciliation (its counters against the calls finalize placed on it: a wrong placement shows
as a difference), and the run keeps only what adds up: the hit rate from the summed counters.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvscope.analysis.reconcile import Reconciliation, counter_values, reconcile
from kvscope.collect.series import counter_delta
from kvscope.records import metrics
from kvscope.records.base import Row
from kvscope.records.metrics import ScrapeSummary, Series
from kvscope.records.run_dir import replica_dirs

_LEVELS = (
    "kv_used_tokens", "kv_evictable_tokens", "kv_usage", "running_requests", "queued_requests",
)  # fmt: skip


def server_summary(series: Series) -> dict[str, float]:
    """Run-level /metrics summaries: peak and mean KV use, mean queue, hit rate from counters."""
    out: dict[str, float] = {}
    for name in _LEVELS:
        values = [v for _, v in series.get(name, ())]
        if values:
            out[f"{name}_peak"] = max(values)
            out[f"{name}_mean"] = sum(values) / len(values)
    prompt, cached = _deltas(series)
    if prompt and cached is not None:
        out["hit_rate_from_counters"] = cached / prompt
    return out


def _deltas(series: Series) -> tuple[float | None, float | None]:
    """The prompt and cached token counters' increase over the run (None: not exposed)."""
    counters = counter_values(series)
    prompt = counter_delta(counters.get("prompt_tokens_total", ()))
    cached = counter_delta(counters.get("cached_tokens_total", ()))
    return prompt, cached


@dataclass(frozen=True)
class ReplicaServer:
    """One replica's /metrics over the run and its counters against the calls it served."""

    name: str
    summary: dict[str, float]  # server_summary of its own series ({} without one)
    scrape: ScrapeSummary | None  # its sampler's numbers; None when it wrote no series
    reconciliation: list[Reconciliation]  # [] without a series
    prompt_delta: float | None  # its prompt and cached token counters' increase
    cached_delta: float | None
    series: Series = field(default_factory=dict, repr=False)  # its instant values over time

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "scrape": asdict(self.scrape) if self.scrape else None,
            "reconciliation": [r.to_dict() for r in self.reconciliation],
        }


def replica_servers(run_dir: Path, rows: Sequence[Row]) -> list[ReplicaServer]:
    """Each replica of a deployment's run, by name (r0, r1, ...); [] for one engine."""
    out = []
    for name, folder in replica_dirs(run_dir).items():
        series = metrics.load_series(folder)
        gaps = folder / metrics.METRICS_GAPS
        sampled = bool(series) or (folder / metrics.METRICS_JSONL).exists()
        served = [r for r in rows if r.get("replica") == name]
        counters = counter_values(series)
        prompt, cached = _deltas(series)
        out.append(
            ReplicaServer(
                name=name,
                summary=server_summary(series),
                scrape=metrics.read_gaps(gaps)[0] if gaps.exists() else None,
                reconciliation=reconcile(served, counters, counter_delta, name) if sampled else [],
                prompt_delta=prompt,
                cached_delta=cached,
                series=series,
            )
        )
    return out


def deployment_summary(replicas: Sequence[ReplicaServer]) -> dict[str, float]:
    """The run-level summary that adds up over replicas: the hit rate from the counters' summed
    increases, where every replica exposed both ({} otherwise)."""
    prompts = [r.prompt_delta for r in replicas]
    cached = [r.cached_delta for r in replicas]
    if not replicas or None in prompts or None in cached:
        return {}
    total = sum(p for p in prompts if p is not None)
    if not total:
        return {}
    return {"hit_rate_from_counters": sum(c for c in cached if c is not None) / total}
