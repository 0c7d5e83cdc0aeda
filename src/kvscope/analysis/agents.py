"""Level-1 metrics, exactly as the design note defines them, and the per-agent summary."""

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from kvscope.records.agents import agent_order
from kvscope.records.requests import STATUS_OK


def weighted_hit_ratio(rows: Iterable[dict[str, Any]]) -> float | None:
    """sum(cached_tokens) / sum(prompt_tokens) over the measured rows (status ok, both known);
    None when there is none or their prompt tokens sum to 0."""
    pairs = [(r["cached_tokens"], r["prompt_tokens"]) for r in rows if _known(r)]
    prompt = sum(p for _, p in pairs)
    return sum(c for c, _ in pairs) / prompt if prompt else None


def recompute_burden(rows: Iterable[dict[str, Any]]) -> int | None:
    """sum(max(prompt_tokens - cached_tokens, 0)) over the measured rows (status ok, both
    known): prompt tokens computed instead of reused; None when no row is measured."""
    known = [r for r in rows if _known(r)]
    if not known:
        return None
    return sum(max(r["prompt_tokens"] - r["cached_tokens"], 0) for r in known)


def percentile(values: Sequence[float | None], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default) of the measured values; None if none."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(frozen=True)
class AgentSummary:
    agent_id: str
    calls: int
    failed: int
    prompt_tokens_p50: float | None
    cached_tokens_p50: float | None
    new_prefill_tokens_p50: float | None
    cached_tokens: int | None
    new_prefill_tokens: int | None  # summed: the recompute burden of this agent
    weighted_hit_ratio: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_p50_ms: float | None
    e2e_p50_ms: float | None
    e2e_p95_ms: float | None
    tool_ms: float | None


def per_agent(rows: Sequence[dict[str, Any]]) -> list[AgentSummary]:
    """One summary per agent (in `agent_order(rows)`), over its successful calls."""
    mine: dict[str | None, list[dict[str, Any]]] = {a: [] for a in agent_order(rows)}
    for r in rows:
        mine[r["agent_id"]].append(r)
    return [_summary(a, calls) for a, calls in mine.items()]  # type: ignore[arg-type]


def overall(rows: Sequence[dict[str, Any]]) -> AgentSummary:
    return _summary("all", list(rows))


def _summary(agent: str, rows: list[dict[str, Any]]) -> AgentSummary:
    ok = [r for r in rows if r["status"] == STATUS_OK]
    # the measured rows (_known), their counts read once
    known = [
        (c, p)
        for r in ok
        if (c := r.get("cached_tokens")) is not None and (p := r.get("prompt_tokens")) is not None
    ]
    new_prefill = [max(p - c, 0) for c, p in known]
    prompt = sum(p for _, p in known)
    tools = [r["tool_ms"] for r in ok if r["tool_ms"] is not None]
    return AgentSummary(
        agent_id=agent,
        calls=len(rows),
        failed=len(rows) - len(ok),
        prompt_tokens_p50=percentile([r["prompt_tokens"] for r in ok], 50),
        cached_tokens_p50=percentile([c for c, _ in known], 50),
        new_prefill_tokens_p50=percentile(new_prefill, 50),
        cached_tokens=sum(c for c, _ in known) if known else None,
        new_prefill_tokens=sum(new_prefill) if known else None,  # recompute_burden
        weighted_hit_ratio=sum(c for c, _ in known) / prompt if prompt else None,
        ttft_p50_ms=percentile([r["ttft_ms"] for r in ok], 50),
        ttft_p95_ms=percentile([r["ttft_ms"] for r in ok], 95),
        tpot_p50_ms=percentile([r["tpot_ms"] for r in ok], 50),
        e2e_p50_ms=percentile([r["e2e_ms"] for r in ok], 50),
        e2e_p95_ms=percentile([r["e2e_ms"] for r in ok], 95),
        tool_ms=sum(tools) if tools else None,
    )


def _known(row: dict[str, Any]) -> bool:
    """A measured row (the design note's rule): the call succeeded and both counts are known."""
    return (
        row.get("status") == STATUS_OK
        and row.get("cached_tokens") is not None
        and row.get("prompt_tokens") is not None
    )


def as_table(summaries: Sequence[AgentSummary]) -> pa.Table:
    """The summaries as an Arrow table (AgentSummary's fields as columns)."""
    if summaries:
        return pa.Table.from_pylist([asdict(s) for s in summaries])
    return pa.table({"agent_id": pa.array([], pa.string()), "calls": pa.array([], pa.int64())})
