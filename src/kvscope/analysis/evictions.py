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
import pyarrow.compute as pc

from kvscope.analysis.agents import percentile
from kvscope.analysis.turns import order_sql, query
from kvscope.records.agents import AgentOrder, agent_key

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


def _evicted(blocks: pa.Table) -> pa.Table:
    """Blocks removed by an eviction (a removal of unknown cause, in older tables, counts)."""
    removal = blocks.column("removal")
    by_eviction = pc.or_kleene(pc.is_null(removal), pc.equal(removal, "evicted"))
    return blocks.filter(pc.and_(pc.is_valid(blocks.column("removed_ns")), by_eviction))


def _harmful(blocks: pa.Table) -> pa.Table:
    """The rows whose `harmful` is true (null: not harmful)."""
    return blocks.filter(pc.fill_null(blocks.column("harmful"), False))


def _by_first(keys: list[str], values: list[Any]) -> dict[str, list[Any]]:
    """values grouped by key, the keys in order of first appearance."""
    out: dict[str, list[Any]] = defaultdict(list)
    for k, v in zip(keys, values, strict=True):
        out[k].append(v)
    return out


def _nonempty(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The column, "" as null (a row's `value or UNKNOWN`)."""
    return pc.if_else(pc.equal(column, ""), None, column)


def _named(column: pa.ChunkedArray) -> list[str]:
    """The column's values, null as UNKNOWN."""
    return pc.fill_null(column, UNKNOWN).to_pylist()  # type: ignore[no-any-return]


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


def by_transition(blocks: pa.Table) -> list[TransitionHarm]:
    """Harmful evictions by the transition (previous agent -> agent) of the request that paid;
    most recomputed tokens first (unknown counts last)."""
    harmful = _harmful(_evicted(blocks))
    needed = _named(_nonempty(harmful.column("needed_by_transition")))
    out = _by_first(needed, harmful.column("recomputed_tokens").to_pylist())
    harms = [
        TransitionHarm(k, len(v), None if (t := known_sum(v)) is None else int(t))
        for k, v in out.items()
    ]
    return sorted(harms, key=lambda h: (h.recomputed_tokens is None, -(h.recomputed_tokens or 0)))


def residency(blocks: pa.Table, order: AgentOrder = ()) -> list[Residency]:
    """How long each agent's blocks stayed in the cache before they were removed (agents in
    `order`, others by name)."""
    owners = pc.fill_null(_nonempty(blocks.column("owner_agent_id")), UNKNOWN)
    evicted = pc.fill_null(pc.equal(blocks.column("removal"), "evicted"), False)
    out = []
    for a in sorted(pc.unique(owners).to_pylist(), key=agent_key(order)):
        mine = pc.equal(owners, a)
        times = pc.drop_null(blocks.column("residency_ms").filter(mine)).to_pylist()
        out.append(Residency(
            a, pc.sum(mine).as_py(), pc.sum(pc.and_(mine, evicted)).as_py() or 0,
            percentile(times, 50), percentile(times, 95), max(times) if times else None,
        ))  # fmt: skip
    return out


def summary(blocks: pa.Table) -> dict[str, float | None]:
    """Run-level numbers for MLflow: eviction counts, harm, and the recomputed tokens overall
    (0 with no eviction; None when no evicted block has it measured) and per evictor -> victim
    pair (None where a harmful block's count is unknown)."""
    ev = _evicted(blocks)
    harmful = _harmful(ev)
    costs = harmful.column("recomputed_tokens").to_pylist()
    out: dict[str, float | None] = {
        "blocks_stored": float(blocks.num_rows),
        "blocks_evicted": float(ev.num_rows),
        "harmful_evictions": float(harmful.num_rows),
        "recomputed_tokens": known_sum(costs)
        if not ev.num_rows or pc.any(pc.is_valid(ev.column("recomputed_tokens"))).as_py()
        else None,
        "evictions_unattributed_evictor": float(ev.column("evictor_agent_id").null_count),
    }
    evictor, owner = (
        _named(_nonempty(harmful.column(c))) for c in ("evictor_agent_id", "owner_agent_id")
    )
    keys = [f"harm.{e}_to_{o}.recomputed_tokens" for e, o in zip(evictor, owner, strict=True)]
    return out | {key: known_sum(v) for key, v in _by_first(keys, costs).items()}
