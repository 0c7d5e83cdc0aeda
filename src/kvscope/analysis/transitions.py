"""RQ2: how does workflow position affect reuse? One row per ordered pair (from -> to).

Two kinds of pair, told apart by the `kind` column; every call appears once in each kind it has:

- "handoff": the workflow's previous call -> this call, i.e. `previous_agent_id -> agent_id`
  ("start" when the call opened its workflow). Planner -> Planner is such a pair when the graph
  runs the Planner twice in a row.
- "same-agent": this agent's previous call in the same workflow -> this call (the agent coming
  back to its own prefix a cycle later). A call that is its agent's first in the workflow has no
  same-agent pair.

Any graph: the agents are those that ran, in the run's agent order (agents.agent_order), and
the matrix is sized to them. A parallel fan-out (LangGraph `Send`) gives every branch the
dispatcher as previous_agent_id, so each dispatcher -> branch edge is counted. A join node's call
has one previous_agent_id (the one the graph recorded, typically one branch): this table counts
that one edge only; the step edges of `kvscope.analysis.predictability` count every branch ->
join edge. Calls outside any workflow (workflow_run_id null) chain among themselves.

The cache numbers of a pair are those of the "to" call (what that call got from the cache):

- calls, failed, measured, prompt_tokens, cached_tokens, weighted_hit_ratio, recompute_burden,
  ttft_p50_ms: as in `kvscope.analysis.turns` (ratios over successful, measured rows).
- miss_share = recompute_burden / prompt_tokens: the share of the prompt NOT served from the
  cache (1 - weighted_hit_ratio).
- miss_calls: measured calls that got no cached token at all (cached_tokens == 0).
- shared_prefix_tokens: sum of the prompt prefix the call shares with the "from" call
  (first_divergence_previous_agent for a handoff, first_divergence_same_agent for a same-agent
  return), over measured rows where that was instrumented; null when it never was.
- unserved_shared_prefix_tokens: sum of max(shared prefix - cached_tokens, 0) over the same
  rows: tokens the "from" call had just computed that this call computed again. Engines cache
  whole blocks, so up to block_size - 1 tokens per call are expected here even without eviction.
- gap_ms_p50: median time from the end of the "from" call to the start of this call (the time
  the prefix had to survive in the cache); the "from" call's end is the latest end of the
  workflow's (for same-agent: the agent's) earlier calls that had ended when this call started
  (see turns.last_end_sql: parallel branches still running do not count); null for "start".
- provenance_calls and the Level-3 provenance sums (cached_self_tokens, ...,
  uncached_cold_tokens) over successful rows; null when not measured.
"""

import pyarrow as pa

from kvscope.analysis.turns import (
    BASE,
    BURDEN,
    CACHE_AGGREGATES,
    PROMPT,
    last_end_sql,
    nonneg,
    order_sql,
    provenance_aggregates,
    query,
    table_order,
)
from kvscope.records.agents import AgentOrder, agent_key

START = "start"
HANDOFF = "handoff"
SAME_AGENT = "same-agent"


def transitions(requests: pa.Table, order: AgentOrder | None = None) -> pa.Table:
    """RQ2 per (kind, from_agent, to_agent), sorted by `order` (default: the table's
    agent_order); see the module docstring for the columns."""
    order = table_order(requests) if order is None else order
    sql = f"""
    WITH base AS ({BASE}),
    chained AS (
      SELECT *,
        {last_end_sql()} AS handoff_end_ns,
        {last_end_sql("AND p.agent_id IS NOT DISTINCT FROM c.agent_id")} AS same_end_ns,
        lag(request_uuid) OVER (PARTITION BY workflow_run_id, agent_id
          ORDER BY start_ns, request_uuid) AS same_previous
      FROM base c
    ),
    pairs AS (
      SELECT '{HANDOFF}' AS kind, coalesce(previous_agent_id, '{START}') AS from_agent,
        first_divergence_previous_agent AS shared_prefix,
        (start_ns - handoff_end_ns) / 1e6 AS gap_ms, *
      FROM chained
      UNION ALL BY NAME
      SELECT '{SAME_AGENT}' AS kind, agent_id AS from_agent,
        first_divergence_same_agent AS shared_prefix,
        (start_ns - same_end_ns) / 1e6 AS gap_ms, *
      FROM chained WHERE same_previous IS NOT NULL
    )
    SELECT kind, from_agent, agent_id AS to_agent, {CACHE_AGGREGATES},
      CAST({BURDEN} AS DOUBLE) / nullif({PROMPT}, 0) AS miss_share,
      count(*) FILTER (WHERE measured AND cached_tokens = 0) AS miss_calls,
      CAST(sum(shared_prefix) FILTER (WHERE measured) AS BIGINT) AS shared_prefix_tokens,
      CAST(sum({nonneg("shared_prefix - cached_tokens")}) FILTER (WHERE measured) AS BIGINT)
        AS unserved_shared_prefix_tokens,
      quantile_cont(gap_ms, 0.5) AS gap_ms_p50,
    {provenance_aggregates()}
    FROM pairs
    GROUP BY kind, from_agent, agent_id
    ORDER BY kind, CASE from_agent WHEN '{START}' THEN -1 ELSE 0 END,
      {order_sql(order, "from_agent")}, {order_sql(order)}
    """
    return query(sql, requests=requests)


def matrix(
    pairs: pa.Table,
    value: str = "weighted_hit_ratio",
    kind: str = HANDOFF,
    order: AgentOrder = (),
) -> tuple[list[str], list[str], list[list[float | None]]]:
    """(from agents, to agents, values[from][to]) of one kind, for a heatmap; None = no pair.

    Sized to what ran: a row per "from" agent that occurs (start first, as `transitions` sorts),
    a column per "to" agent that occurs, in `order` (agents.agent_key; default: the order the
    table's "from" agents come in, as `transitions` sorted them)."""
    rows = [r for r in pairs.to_pylist() if r["kind"] == kind]
    froms = list(dict.fromkeys(r["from_agent"] for r in rows))
    tos = list(dict.fromkeys(r["to_agent"] for r in rows))
    tos.sort(key=agent_key(order or [f for f in froms if f != START]))
    cells: list[list[float | None]] = [[None] * len(tos) for _ in froms]
    for r in rows:
        cells[froms.index(r["from_agent"])][tos.index(r["to_agent"])] = r[value]
    return froms, tos, cells
