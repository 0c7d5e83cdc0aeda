"""Level-1 metrics, exactly as the design note defines them, and the per-agent summary."""

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from kvscope.records.requests import STATUS_OK
from kvscope.workload.prompts import AGENTS as AGENT_ORDER  # the PEER graph's agents, in order


def agent_key(agent: str | None) -> tuple[int, str]:
    """Sort key: PEER order first, then other agents by name, then calls no agent was named for
    (None) (SQL: turns.agent_order)."""
    if agent is None:
        return (len(AGENT_ORDER) + 1, "")
    return (AGENT_ORDER.index(agent) if agent in AGENT_ORDER else len(AGENT_ORDER), agent)


def weighted_hit_ratio(rows: Iterable[dict[str, Any]]) -> float | None:
    """sum(cached_tokens) / sum(prompt_tokens) over the rows where both were measured."""
    pairs = [(r["cached_tokens"], r["prompt_tokens"]) for r in rows if _known(r)]
    prompt = sum(p for _, p in pairs)
    return sum(c for c, _ in pairs) / prompt if prompt else None


def recompute_burden(rows: Iterable[dict[str, Any]]) -> int | None:
    """sum(max(prompt_tokens - cached_tokens, 0)): prompt tokens computed instead of reused."""
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
    """One summary per agent (PEER order first), over its successful calls."""
    agents = sorted({r["agent_id"] for r in rows}, key=agent_key)
    return [_summary(a, [r for r in rows if r["agent_id"] == a]) for a in agents]


def overall(rows: Sequence[dict[str, Any]]) -> AgentSummary:
    return _summary("all", list(rows))


def _summary(agent: str, rows: list[dict[str, Any]]) -> AgentSummary:
    ok = [r for r in rows if r["status"] == STATUS_OK]
    known = [r for r in ok if _known(r)]
    tools = [r["tool_ms"] for r in ok if r["tool_ms"] is not None]
    return AgentSummary(
        agent_id=agent,
        calls=len(rows),
        failed=len(rows) - len(ok),
        prompt_tokens_p50=percentile([r["prompt_tokens"] for r in ok], 50),
        cached_tokens_p50=percentile([r["cached_tokens"] for r in known], 50),
        new_prefill_tokens_p50=percentile(
            [max(r["prompt_tokens"] - r["cached_tokens"], 0) for r in known], 50
        ),
        cached_tokens=sum(r["cached_tokens"] for r in known) if known else None,
        new_prefill_tokens=recompute_burden(known),
        weighted_hit_ratio=weighted_hit_ratio(known),
        ttft_p50_ms=percentile([r["ttft_ms"] for r in ok], 50),
        ttft_p95_ms=percentile([r["ttft_ms"] for r in ok], 95),
        tpot_p50_ms=percentile([r["tpot_ms"] for r in ok], 50),
        e2e_p50_ms=percentile([r["e2e_ms"] for r in ok], 50),
        e2e_p95_ms=percentile([r["e2e_ms"] for r in ok], 95),
        tool_ms=sum(tools) if tools else None,
    )


def _known(row: dict[str, Any]) -> bool:
    return row.get("cached_tokens") is not None and row.get("prompt_tokens") is not None


def as_table(summaries: Sequence[AgentSummary]) -> pa.Table:
    """The summaries as an Arrow table (AgentSummary's fields as columns)."""
    if summaries:
        return pa.Table.from_pylist([asdict(s) for s in summaries])
    return pa.table({"agent_id": pa.array([], pa.string()), "calls": pa.array([], pa.int64())})
