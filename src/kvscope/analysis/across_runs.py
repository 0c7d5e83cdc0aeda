"""Across runs: prompt layout (RQ3), cache pressure (RQ4) and cross-agent sharing (RQ5).

Each function takes several request tables, one per run, and stacks the per-agent views with
the run's label or parameters in front. Every agent view has an "all" row (the run as a whole).
Ratios follow `kvscope.analysis.turns`: successful calls with both token counts measured.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from kvscope.analysis.turns import BASE, CACHE_AGGREGATES, order_sql, query, table_order
from kvscope.records.agents import agent_key

ALL = "all"
SHARING_ORDER = ("none", "system", "task", "documents", "branch")
UNKNOWN = "unknown"
LOSS_THRESHOLD = 0.9

# Level 3's sum comes with its coverage: provenance_calls = the successful calls it sums over.
_EXTRA = """,
  count(cached_cross_agent_tokens) FILTER (WHERE status = 'ok') AS provenance_calls,
  CAST(sum(cached_cross_agent_tokens) FILTER (WHERE status = 'ok') AS BIGINT)
    AS cached_cross_agent_tokens,
  avg(first_divergence_previous_agent) FILTER (WHERE status = 'ok')
    AS first_divergence_previous_agent_mean,
  avg(max_reusable_tokens) FILTER (WHERE status = 'ok') AS max_reusable_tokens_mean,
  avg(prompt_tokens) FILTER (WHERE status = 'ok') AS prompt_tokens_mean"""


def _per_agent(requests: pa.Table, keys: str = "") -> pa.Table:
    """Per agent (and the run as a whole, agent "all") with CACHE_AGGREGATES and _EXTRA.

    `keys`: extra grouping columns of the request table (e.g. "sharing_mode,").
    """
    sql = f"""
    WITH base AS ({BASE})
    SELECT {keys} agent_id, {CACHE_AGGREGATES}{_EXTRA} FROM base GROUP BY {keys} agent_id
    UNION ALL BY NAME
    SELECT {keys} '{ALL}' AS agent_id, {CACHE_AGGREGATES}{_EXTRA} FROM base
    {"GROUP BY " + keys.rstrip(", ") if keys else ""}
    """
    return query(sql, requests=requests)


def _stack(parts: Iterable[tuple[dict[str, Any], pa.Table]], order: str) -> pa.Table:
    """Concatenate per-run tables, each prefixed with its constant columns, sorted by `order`."""
    tables = []
    for consts, table in parts:
        for i, (name, value) in enumerate(consts.items()):
            column = pa.array([value] * len(table), _arrow_type(value))
            table = table.add_column(i, pa.field(name, column.type), column)
        tables.append(table)
    if not tables:
        return pa.table({})
    stacked = pa.concat_tables(tables, promote_options="permissive")
    return query(f"SELECT * FROM t ORDER BY {order}", t=stacked)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _arrow_type(value: Any) -> pa.DataType:
    if value is None:
        return pa.null()
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


def runs_order(tables: Iterable[pa.Table]) -> list[str | None]:
    """The agents of several runs: each run's agent_order, in the runs' order, first seen first."""
    return list(dict.fromkeys(a for t in tables for a in table_order(t)))


def _agent_last(order: Sequence[str | None], column: str = "agent_id") -> str:
    return f"CASE WHEN {column} = '{ALL}' THEN 1 ELSE 0 END, {order_sql(order, column)}"


def layout_comparison(runs: Mapping[str, pa.Table]) -> pa.Table:
    """RQ3: per run and agent, how the prompt layout changed reuse.

    Columns: run, prompt_layout (the run's layouts, comma-joined; "unknown" when unrecorded),
    agent_id ("all" = the run), calls, failed, measured, prompt_tokens, cached_tokens,
    weighted_hit_ratio, recompute_burden, ttft_p50_ms, provenance_calls (the successful calls
    with Level 3 provenance), cached_cross_agent_tokens (their sum; null when none has it),
    first_divergence_previous_agent_mean, max_reusable_tokens_mean (prompt
    instrumentation; null when not measured), prompt_tokens_mean.
    """
    parts = [
        ({"run": label, "prompt_layout": distinct_values(t, "prompt_layout")}, _per_agent(t))
        for label, t in runs.items()
    ]
    return _stack(parts, f"run, {_agent_last(runs_order(runs.values()))}")


def distinct_values(table: pa.Table, column: str) -> str:
    """The column's distinct non-null values, sorted and comma-joined; "unknown" if none."""
    if column not in table.column_names:
        return UNKNOWN
    values = sorted({v for v in table[column].to_pylist() if v is not None})
    return ",".join(values) or UNKNOWN


def pressure_sweep(runs: Sequence[tuple[Mapping[str, Any], pa.Table]]) -> pa.Table:
    """RQ4: per run and agent, reuse against KV capacity and concurrency.

    `runs`: (params, requests) pairs; params may hold "run" (a label), "kv_capacity_tokens"
    (the engine's KV capacity in tokens), "concurrency" (workflows in flight) and "group" (what
    else sets runs apart, e.g. "layout=role-first": runs of different groups are never
    compared); a missing one is null. Columns: run, kv_capacity_tokens, concurrency, group,
    then the `layout_comparison` agent columns from agent_id on. Sorted by concurrency,
    capacity (largest first), group, run, agent.
    """
    parts = [
        (
            {
                "run": str(params.get("run", i)),
                "kv_capacity_tokens": _int(params.get("kv_capacity_tokens")),
                "concurrency": _int(params.get("concurrency")),
                "group": params.get("group"),
            },
            _per_agent(table),
        )
        for i, (params, table) in enumerate(runs)
    ]
    order = (
        "concurrency NULLS FIRST, kv_capacity_tokens DESC NULLS FIRST, "
        f'"group" NULLS FIRST, run, {_agent_last(runs_order(t for _, t in runs))}'
    )
    return _stack(parts, order)


@dataclass(frozen=True)
class ReuseLoss:
    """The agent that loses reuse first along one pressure axis (the other axis fixed)."""

    agent_id: str
    axis: str  # "kv_capacity_tokens" or "concurrency"
    at: int  # the least pressure (largest capacity / smallest concurrency) where it drops
    reference_at: int  # the least-pressure point of the sweep
    reference_ratio: float
    ratio: float  # its weighted hit ratio at `at`
    fixed: int | None  # the other axis's value for this comparison
    group: str | None = None  # the sweep's group (see pressure_sweep)


def first_to_lose_reuse(
    sweep: pa.Table, axis: str = "kv_capacity_tokens", threshold: float = LOSS_THRESHOLD
) -> list[ReuseLoss]:
    """RQ4: which agent's reuse drops first as pressure grows; one answer per value of the
    other axis and group.

    Rule: pressure grows as kv_capacity_tokens falls (or concurrency rises). Each agent's
    reference is its weighted hit ratio at the least-pressure point of the sweep; the agent
    "drops" at the least-pressure point where its ratio falls below `threshold` x reference.
    The agent that drops at the least pressure loses reuse first; a tie goes to the larger
    relative drop there. Runs at the same point are pooled (sum cached / sum prompt). Agents
    with no or zero reference ratio have nothing to lose and are skipped; the "all" rows are
    ignored. No entry for a group where no agent drops.
    """
    other = "concurrency" if axis == "kv_capacity_tokens" else "kv_capacity_tokens"
    rows = [
        r
        for r in sweep.to_pylist()
        if r["agent_id"] != ALL and r[axis] is not None and r["weighted_hit_ratio"] is not None
    ]
    keys = {(r[other], r.get("group")) for r in rows}
    losses = []
    for fixed, group in sorted(keys, key=lambda k: (k[0] is not None, k[0] or 0, k[1] or "")):
        members = [r for r in rows if r[other] == fixed and r.get("group") == group]
        loss = _first_loss(members, axis, threshold)
        if loss is not None:
            losses.append(ReuseLoss(*loss, fixed=fixed, group=group))
    return losses


def _first_loss(
    rows: list[dict[str, Any]], axis: str, threshold: float
) -> tuple[str, str, int, int, float, float] | None:
    sign = -1 if axis == "kv_capacity_tokens" else 1  # sort key: least pressure first
    points = sorted({r[axis] for r in rows}, key=lambda v: sign * v)
    if len(points) < 2:
        return None
    ref_at = points[0]
    candidates = []
    seen = list(dict.fromkeys(r["agent_id"] for r in rows))  # the sweep's rows are in agent order
    for agent in sorted(set(seen), key=agent_key(seen)):
        ratio = pooled([r for r in rows if r["agent_id"] == agent], axis)
        ref = ratio.get(ref_at)
        if not ref:
            continue
        for rank, at in enumerate(points[1:], 1):
            if at in ratio and ratio[at] < threshold * ref:
                candidates.append((rank, -(1 - ratio[at] / ref), agent, at, ref, ratio[at]))
                break
    if not candidates:
        return None
    _, _, agent, at, ref, got = min(candidates)
    return agent, axis, at, ref_at, ref, got


def pooled(rows: Sequence[dict[str, Any]], axis: str) -> dict[Any, float]:
    """Weighted hit ratio per point of the axis, pooled over all the rows (per-run agent sums)
    at that point: sum cached / sum prompt over the rows with both known."""
    out = {}
    for at in {r[axis] for r in rows}:
        known = [
            r
            for r in rows
            if r[axis] == at and r["cached_tokens"] is not None and r["prompt_tokens"] is not None
        ]
        prompt = sum(r["prompt_tokens"] for r in known)
        if prompt:
            out[at] = sum(r["cached_tokens"] for r in known) / prompt
    return out


def sharing_comparison(runs: Mapping[str, pa.Table]) -> pa.Table:
    """RQ5: per run, sharing mode and agent: what cross-agent prefix sharing bought.

    Columns: run, sharing_mode (the row's mode; "unknown" when not recorded), agent_id ("all" =
    the mode's rows of that run), then the `layout_comparison` agent columns from calls on.
    Sorted by mode (none, system, task, documents, branch, then others), run, agent.
    """
    whens = " ".join(f"WHEN '{m}' THEN {i}" for i, m in enumerate(SHARING_ORDER))
    parts = []
    for label, table in runs.items():
        modes = query(
            f"SELECT coalesce(sharing_mode, '{UNKNOWN}') AS sharing_mode, * EXCLUDE (sharing_mode)"
            " FROM requests",
            requests=table,
        )
        parts.append(({"run": label}, _per_agent(modes, "sharing_mode,")))
    order = f"CASE sharing_mode {whens} ELSE {len(SHARING_ORDER)} END, sharing_mode, run, " + (
        _agent_last(runs_order(runs.values()))
    )
    return _stack(parts, order)
