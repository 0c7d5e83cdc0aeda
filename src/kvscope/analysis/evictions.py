"""Eviction attribution tables over the block table (analysis.provenance's `blocks`).

The victim of an eviction is the agent whose request stored the block; the evictor is inferred
(see provenance). A harmful eviction is one whose block a later request needed and recomputed;
its cost, in recomputed tokens, is charged to (evictor agent -> victim agent).
"""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from kvscope.analysis.agents import AgentOrder, agent_key, percentile
from kvscope.analysis.turns import order_sql, query

UNKNOWN = "unknown"


@dataclass(frozen=True)
class TransitionHarm:
    transition: str  # of the request that recomputed: previous agent -> agent
    harmful: int
    recomputed_tokens: int | None  # None when a harmful block's count is unknown


@dataclass(frozen=True)
class Residency:
    agent_id: str  # owner
    blocks: int
    evicted: int
    residency_p50_ms: float | None  # over the blocks that were removed
    residency_p95_ms: float | None
    residency_max_ms: float | None


def _evicted(blocks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocks removed by an eviction (a removal of unknown cause, in older tables, counts)."""
    return [b for b in blocks if b["removed_ns"] is not None and b["removal"] in ("evicted", None)]


def matrix(blocks: pa.Table, order: AgentOrder = ()) -> pa.Table:
    """Who evicted whom: evictor agent x victim agent over a run's block table (blocks.parquet).

    A block counts as evicted when it was removed (removed_ns not null) by an eviction
    (removal = 'evicted'; a removal of unknown cause, null in older tables, counts). The
    victim is the agent that stored the block (owner_agent_id); an agent that is not known is
    "unknown".
    Columns: evictor_agent_id, victim_agent_id, evictions, same_workflow (evictions where
    evictor and owner were the same workflow run), harmful (evicted blocks a later call needed
    and recomputed), recomputed_tokens (sum over the harmful blocks; null when no block of the
    pair has it measured),
    residency_ms_p50 (how long the evicted blocks had lived).
    Sorted by `order` (the run's agents.agent_order; others by name, "unknown" among them).
    """
    sql = f"""
    SELECT * FROM (
    SELECT coalesce(evictor_agent_id, 'unknown') AS evictor_agent_id,
      coalesce(owner_agent_id, 'unknown') AS victim_agent_id,
      count(*) AS evictions,
      count(*) FILTER (WHERE evictor_workflow_run_id = owner_workflow_run_id) AS same_workflow,
      count(*) FILTER (WHERE harmful) AS harmful,
      CASE WHEN count(recomputed_tokens) > 0
        AND count(*) FILTER (WHERE harmful AND recomputed_tokens IS NULL) = 0
        THEN CAST(coalesce(sum(recomputed_tokens) FILTER (WHERE harmful), 0) AS BIGINT)
      END AS recomputed_tokens,
      quantile_cont(residency_ms, 0.5) AS residency_ms_p50
    FROM blocks
    WHERE removed_ns IS NOT NULL AND coalesce(removal, 'evicted') = 'evicted'
    GROUP BY ALL
    ) ORDER BY {order_sql(order, "evictor_agent_id")}, {order_sql(order, "victim_agent_id")}
    """
    return query(sql, blocks=blocks)


def known_sum(values: Sequence[int | float | None]) -> float | None:
    """The sum, or None when any value is unknown (an unknown count is not 0)."""
    return None if any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]


def by_transition(blocks: Sequence[dict[str, Any]]) -> list[TransitionHarm]:
    """Harmful evictions by the transition (previous agent -> agent) of the request that paid;
    most recomputed tokens first (unknown counts last)."""
    out: dict[str, list[int | None]] = defaultdict(list)
    for b in _evicted(blocks):
        if b["harmful"]:
            out[b["needed_by_transition"] or UNKNOWN].append(b["recomputed_tokens"])
    harms = [
        TransitionHarm(k, len(v), None if (t := known_sum(v)) is None else int(t))
        for k, v in out.items()
    ]
    return sorted(harms, key=lambda h: (h.recomputed_tokens is None, -(h.recomputed_tokens or 0)))


def residency(blocks: Sequence[dict[str, Any]], order: AgentOrder = ()) -> list[Residency]:
    """How long each agent's blocks stayed in the cache before they were removed (agents in
    `order`, others by name)."""
    agents = sorted({b["owner_agent_id"] or UNKNOWN for b in blocks}, key=agent_key(order))
    out = []
    for a in agents:
        mine = [b for b in blocks if (b["owner_agent_id"] or UNKNOWN) == a]
        times = [b["residency_ms"] for b in mine if b["residency_ms"] is not None]
        out.append(Residency(
            a, len(mine), sum(b["removal"] == "evicted" for b in mine),
            percentile(times, 50), percentile(times, 95), max(times) if times else None,
        ))  # fmt: skip
    return out


def summary(blocks: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Run-level numbers for MLflow: eviction counts, harm, and the recomputed tokens overall
    (0 with no eviction; None when no evicted block has it measured) and per evictor -> victim
    pair (None where a harmful block's count is unknown)."""
    ev = _evicted(blocks)
    harmful = [b for b in ev if b["harmful"]]
    out: dict[str, float | None] = {
        "blocks_stored": float(len(blocks)),
        "blocks_evicted": float(len(ev)),
        "harmful_evictions": float(len(harmful)),
        "recomputed_tokens": known_sum([b["recomputed_tokens"] for b in harmful])
        if not ev or any(b["recomputed_tokens"] is not None for b in ev)
        else None,
        "evictions_unattributed_evictor": float(sum(b["evictor_agent_id"] is None for b in ev)),
    }
    pairs: dict[str, list[int | None]] = defaultdict(list)
    for b in harmful:
        pair = f"{b['evictor_agent_id'] or UNKNOWN}_to_{b['owner_agent_id'] or UNKNOWN}"
        pairs[f"harm.{pair}.recomputed_tokens"].append(b["recomputed_tokens"])
    return out | {key: known_sum(v) for key, v in pairs.items()}
