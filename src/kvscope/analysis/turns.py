"""RQ1: do agents behave differently, and how does that change across workflow turns?

Every analysis in this package runs over the canonical request table
(`kvscope.records.requests.load_table`) and follows the design note's definitions:

- a row counts in a cache ratio only if its call succeeded (status "ok") and both
  `prompt_tokens` and `cached_tokens` were measured ("measured" rows); a null is "not measured",
  never 0;
- weighted hit ratio = sum(cached_tokens) / sum(prompt_tokens) over the measured rows;
- recompute burden = sum(max(prompt_tokens - cached_tokens, 0)) over the measured rows;
- latency percentiles are over successful calls, linear interpolation (numpy's default).

This module also holds the small SQL helpers the other analyses share.
"""

import duckdb
import pyarrow as pa

from kvscope.analysis.agents import as_table, per_agent
from kvscope.records.agents import AgentOrder, agent_order
from kvscope.records.requests import PROVENANCE_COLUMNS, STATUS_OK, RequestRecord

# The view every query starts from: the table plus a `measured` flag.
BASE = f"""
SELECT *,
  status = '{STATUS_OK}' AND prompt_tokens IS NOT NULL AND cached_tokens IS NOT NULL AS measured
FROM requests
"""

# The design note's two cache numbers over a group of rows (of BASE), as SQL; the same
# definitions as kvscope.analysis.agents.weighted_hit_ratio / recompute_burden.
PROMPT = "sum(prompt_tokens) FILTER (WHERE measured)"
BURDEN = "sum(greatest(prompt_tokens - cached_tokens, 0)) FILTER (WHERE measured)"
HIT_RATIO = f"sum(cached_tokens) FILTER (WHERE measured) / nullif({PROMPT}, 0)"

# calls, failed, measured, prompt_tokens, cached_tokens, weighted_hit_ratio, recompute_burden,
# ttft_p50_ms: the cache aggregates of one group of rows (of BASE).
CACHE_AGGREGATES = f"""
  count(*) AS calls,
  count(*) FILTER (WHERE status <> '{STATUS_OK}') AS failed,
  count(*) FILTER (WHERE measured) AS measured,
  CAST({PROMPT} AS BIGINT) AS prompt_tokens,
  CAST(sum(cached_tokens) FILTER (WHERE measured) AS BIGINT) AS cached_tokens,
  {HIT_RATIO} AS weighted_hit_ratio,
  CAST({BURDEN} AS BIGINT) AS recompute_burden,
  quantile_cont(ttft_ms, 0.5) FILTER (WHERE status = '{STATUS_OK}') AS ttft_p50_ms
"""


def provenance_aggregates() -> str:
    """provenance_calls (successful rows with Level-3 provenance) and each provenance sum.

    A sum is null when no successful row of the group has that column measured.
    """
    sums = ",\n".join(
        f"  CAST(sum({c}) FILTER (WHERE status = '{STATUS_OK}') AS BIGINT) AS {c}"
        for c in PROVENANCE_COLUMNS
    )
    has = f"status = '{STATUS_OK}' AND cached_self_tokens IS NOT NULL"
    return f"  count(*) FILTER (WHERE {has}) AS provenance_calls,\n{sums}"


def nonneg(expr: str) -> str:
    """SQL max(expr, 0) that stays null when expr is null (DuckDB's greatest skips nulls)."""
    return f"CASE WHEN ({expr}) IS NULL THEN NULL ELSE greatest({expr}, 0) END"


def last_end_sql(same: str = "") -> str:
    """SQL: the latest end_ns among the calls of this call's workflow (and `same` condition)
    that started before it and had ended when it started; null if none. The query names the
    call's table `c` and BASE `base`.

    For a sequential workflow this is the previous call's end (lag by start); for parallel
    branches it is not a sibling still running but the last call that had finished (the
    dispatcher for a fan-out's branches, the last branch to finish for a join).
    """
    return f"""(SELECT max(p.end_ns) FROM base p
      WHERE p.workflow_run_id IS NOT DISTINCT FROM c.workflow_run_id {same}
        AND (p.start_ns < c.start_ns OR (p.start_ns = c.start_ns AND p.request_uuid <
          c.request_uuid))
        AND p.end_ns <= c.start_ns)"""


def order_sql(order: AgentOrder, column: str = "agent_id") -> str:
    """SQL sort key of `column`: the agents of `order` (agents.agent_order) by position, then
    other agents by name, then null (the same rule as agents.agent_key)."""
    agents = [a for a in order if a is not None]
    whens = " ".join(f"WHEN {sql_str(a)} THEN {i}" for i, a in enumerate(agents))
    if not agents:
        return f"{column} IS NULL, {column}"
    return f"{column} IS NULL, CASE {column} {whens} ELSE {len(agents)} END, {column}"


def sql_str(text: str) -> str:
    """A SQL string literal of `text` (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def table_order(requests: pa.Table) -> list[str | None]:
    """agents.agent_order of a request table."""
    cols = [c for c in ("agent_id", "start_ns") if c in requests.column_names]
    return agent_order(requests.select(cols).to_pylist())


def query(sql: str, **tables: pa.Table) -> pa.Table:
    """Run `sql` with each keyword table registered under its name (requests are conformed)."""
    con = duckdb.connect()
    try:
        for name, table in tables.items():
            con.register(name, RequestRecord.conform(table) if name == "requests" else table)
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()


def agent_summary(requests: pa.Table) -> pa.Table:
    """RQ1 per agent: `kvscope.analysis.agents.per_agent` as a table (its AgentSummary fields).

    Columns: agent_id, calls, failed, prompt_tokens_p50, cached_tokens_p50,
    new_prefill_tokens_p50, cached_tokens, new_prefill_tokens (= recompute burden),
    weighted_hit_ratio, ttft_p50_ms, ttft_p95_ms, tpot_p50_ms, e2e_p50_ms, e2e_p95_ms, tool_ms.
    """
    return as_table(per_agent(RequestRecord.conform(requests).to_pylist()))


def agent_turns(requests: pa.Table, order: AgentOrder | None = None) -> pa.Table:
    """RQ1 per agent x turn: how each agent's reuse changes across its visits (turns).

    Columns: agent_id, turn_id, calls (all rows), failed (status != ok), measured (ok rows with
    prompt and cached tokens), prompt_tokens, cached_tokens (sums over measured rows),
    weighted_hit_ratio, recompute_burden, ttft_p50_ms (successful calls).
    Sorted by `order` (default: the table's agent_order), then turn.
    """
    order = table_order(requests) if order is None else order
    sql = f"""
    SELECT agent_id, turn_id, {CACHE_AGGREGATES}
    FROM ({BASE})
    GROUP BY agent_id, turn_id
    ORDER BY {order_sql(order)}, turn_id
    """
    return query(sql, requests=requests)
