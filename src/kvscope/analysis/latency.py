"""RQ6: where does workflow completion time go, and what do cache misses cost?

A sequential workflow's (PEER's) critical path is its chain of calls in start order. Along it,
every millisecond lands in exactly one component:

- per call (`call_ms` = end_ns - start_ns of a successful call):
  queue_ms    the engine's queue time (null when the engine does not report it);
  prefill_ms  prefill_ms when the engine reported it, else ttft_ms - queue_ms;
  decode_ms   decode_ms when reported, else e2e_ms - ttft_ms;
  ttft_unsplit_ms  TTFT the engine did not split into queue and prefill (ttft minus whichever
              of the two is known); null when both are known;
  call_other_ms    the rest of the call (client, network, first-token overhead): call_ms minus
              the components above, never below 0; time_split.py says, per run, how much of it
              is the engine's front end and how much the client's side;
- failed_ms: the whole call_ms of a failed call;
- tool_ms: the agent's tool time before its call (Executor);
- other_ms: the gap between the previous call's end and this call's start, minus the tool
  time (graph step, prompt building: "other/client"), never below 0. The first call of a
  workflow has no gap. The previous call is the last one that had ended when this call started
  (turns.last_end_sql): a parallel branch's gap runs from its dispatcher, not from a sibling.

With parallel branches (a graph's `Send` fan-out), path_ms sums every branch: it is the agents'
time, larger than wall_ms. The critical path is the chain that ends last: from the workflow's
last-ending call back through each call's predecessor (the call whose end is the latest before its
start, as above: a join's predecessor is the slowest branch). `critical` marks its calls;
critical_path_ms sums their time, and equals path_ms when the workflow is sequential.

Each call's gap, tool and call time belong to that call's agent, so agent times add up to the
workflow time (`path_ms` = sum of call, tool and other time along the chain; equal to the wall
time `wall_ms` = last end - first start when tools fit in their gaps).

Cache-miss cost: prefill_ms = a + b * new_prefill_tokens is fitted by least squares over the
run's successful rows (`fit_prefill_cost`). A call's cache_miss_ms = b * (uncached_evicted_tokens
+ uncached_layout_tokens): the prefill spent on tokens that had been in the cache (evicted) or
whose content was there behind another prefix (layout). It is null when the Level-3 provenance
columns were not measured: a part of prefill_ms, not an extra component.
"""

import math
from dataclasses import dataclass

import pyarrow as pa

from kvscope.analysis.turns import (
    BASE,
    BURDEN,
    HIT_RATIO,
    last_end_sql,
    nonneg,
    order_sql,
    query,
    table_order,
)
from kvscope.records.requests import STATUS_OK

LOW_HIT = 0.5  # an agent below this weighted hit ratio ...
SMALL_SHARE = 0.15  # ... with less than this share of workflow time is flagged as cheap to ignore
MIN_FIT_ROWS = 3

COMPONENTS = (
    "queue_ms",
    "prefill_ms",
    "ttft_unsplit_ms",
    "decode_ms",
    "call_other_ms",
    "failed_ms",
    "tool_ms",
    "other_ms",
)

COMPONENT_LABELS = {
    "queue_ms": "queue",
    "prefill_ms": "prefill",
    "ttft_unsplit_ms": "TTFT (queue+prefill not split)",
    "decode_ms": "decode",
    "call_other_ms": "call overhead",
    "failed_ms": "failed calls",
    "tool_ms": "tool",
    "other_ms": "other/client (between calls)",
}


@dataclass(frozen=True)
class PrefillFit:
    """prefill time (`fit_on`) = intercept_ms + ms_per_token * new_prefill_tokens."""

    intercept_ms: float
    ms_per_token: float
    r2: float | None
    rows: int
    fit_on: str  # "prefill_ms" (reported or ttft - queue), or "ttft_ms" when no prefill known


_CALL_REST = "span_ms - coalesce(q, 0) - coalesce(p, 0) - coalesce(d, 0) - coalesce(u, 0)"

_ROWS = f"""
WITH base AS ({BASE}),
est AS (
  SELECT *, status = '{STATUS_OK}' AS ok, (end_ns - start_ns) / 1e6 AS span_ms,
    coalesce(prefill_ms, ttft_ms - queue_ms) AS prefill_est,
    coalesce(decode_ms, e2e_ms - ttft_ms) AS decode_est,
    {last_end_sql()} AS prev_end_ns
  FROM base c
),
split AS (
  SELECT *,
    CASE WHEN ok THEN queue_ms END AS q,
    CASE WHEN ok THEN prefill_est END AS p,
    CASE WHEN ok THEN decode_est END AS d,
    CASE WHEN ok AND (queue_ms IS NULL OR prefill_est IS NULL)
      THEN {nonneg("ttft_ms - coalesce(queue_ms, 0) - coalesce(prefill_est, 0)")} END AS u,
    (start_ns - prev_end_ns) / 1e6 AS gap_ms
  FROM est
)
SELECT workflow_run_id, agent_id, turn_id, request_uuid, start_ns, end_ns, status, measured,
  prompt_tokens, cached_tokens,
  CASE WHEN measured THEN greatest(prompt_tokens - cached_tokens, 0) END AS new_prefill,
  uncached_evicted_tokens + uncached_layout_tokens AS miss_tokens,
  CASE WHEN ok THEN span_ms END AS call_ms,
  q AS queue_ms, p AS prefill_ms, u AS ttft_unsplit_ms, d AS decode_ms,
  CASE WHEN ok THEN {nonneg(_CALL_REST)} END AS call_other_ms,
  CASE WHEN NOT ok THEN span_ms END AS failed_ms,
  tool_ms,
  {nonneg("gap_ms - coalesce(tool_ms, 0)")} AS other_ms,
  ttft_ms
FROM split
"""


def call_rows(requests: pa.Table, fit: PrefillFit | None = None) -> pa.Table:
    """One row per call: the components above, new_prefill, miss_tokens and cache_miss_ms.

    Columns: workflow_run_id, agent_id, turn_id, request_uuid, start_ns, end_ns, status, measured,
    prompt_tokens, cached_tokens, new_prefill, miss_tokens (evicted + layout, null unless both
    measured), call_ms, queue_ms, prefill_ms, ttft_unsplit_ms, decode_ms, call_other_ms,
    failed_ms, tool_ms, other_ms, ttft_ms, cache_miss_ms.
    """
    rows = query(_ROWS + " ORDER BY workflow_run_id, start_ns", requests=requests)
    b = fit.ms_per_token if fit else None
    miss = [None if b is None or m is None else b * m for m in rows["miss_tokens"].to_pylist()]
    rows = rows.append_column("cache_miss_ms", pa.array(miss, pa.float64()))
    return rows.append_column("critical", pa.array(critical_calls(rows), pa.bool_()))


def critical_calls(rows: pa.Table) -> list[bool]:
    """Per call row (workflow_run_id, request_uuid, start_ns, end_ns): on its critical path?

    Per workflow (null is one workflow), from the call that ended last (ties: started last)
    back through predecessors: the call with the latest end at or before this call's start,
    among calls that started before it (the order of `turns.last_end_sql`).
    """
    calls = rows.select(["workflow_run_id", "request_uuid", "start_ns", "end_ns"]).to_pylist()
    by_workflow: dict[str | None, list[int]] = {}
    for i, c in enumerate(calls):
        by_workflow.setdefault(c["workflow_run_id"], []).append(i)
    on = [False] * len(calls)
    for members in by_workflow.values():
        key = {i: (calls[i]["start_ns"], calls[i]["request_uuid"] or "") for i in members}
        i: int | None = max(members, key=lambda j: (calls[j]["end_ns"], key[j]))
        while i is not None:
            on[i] = True
            before = [
                j for j in members if key[j] < key[i] and calls[j]["end_ns"] <= calls[i]["start_ns"]
            ]
            i = max(before, key=lambda j: (calls[j]["end_ns"], key[j])) if before else None
    return on


def fit_prefill_cost(requests: pa.Table) -> PrefillFit | None:
    """Least-squares prefill time vs new prefill tokens over successful, measured calls.

    Fits prefill_ms (reported, or ttft - queue) when at least MIN_FIT_ROWS calls have it, else
    TTFT (then the slope also carries queueing). None when too few calls, no spread in tokens,
    or a slope that is not positive: time that does not grow with the tokens is no prefill cost
    (a replay would price the tokens it saves at <= 0 ms).
    """
    rows = query(_ROWS, requests=requests)
    for y in ("prefill_ms", "ttft_ms"):
        got = query(
            f"""SELECT regr_intercept({y}, new_prefill) AS a, regr_slope({y}, new_prefill) AS b,
                  regr_r2({y}, new_prefill) AS r2, regr_count({y}, new_prefill) AS n
                FROM rows WHERE status = '{STATUS_OK}'""",
            rows=rows,
        ).to_pylist()[0]
        if got["n"] >= MIN_FIT_ROWS:
            if got["a"] is None or got["b"] is None or math.isnan(got["b"]):
                return None  # no spread in new_prefill_tokens: no slope
            if got["b"] <= 0:
                return None  # time falls (or stays) as tokens grow: noise, not a prefill cost
            return PrefillFit(got["a"], got["b"], got["r2"], int(got["n"]), y)
    return None


_OWN = " + ".join(f"coalesce({c}, 0)" for c in COMPONENTS)  # a call's time, all components


def _sums(group: str) -> str:
    parts = ",\n".join(f"  sum({c}) AS {c}" for c in (*COMPONENTS, "cache_miss_ms"))
    return f"""
  {group}, count(*) AS calls,
  count(*) FILTER (WHERE status <> '{STATUS_OK}') AS failed,
  sum(call_ms) AS call_ms,
{parts},
  count(cache_miss_ms) AS cache_miss_calls,
  sum({_OWN}) AS path_ms,
  coalesce(sum({_OWN}) FILTER (WHERE critical), 0) AS critical_path_ms,
  {HIT_RATIO} AS weighted_hit_ratio,
  CAST({BURDEN} AS BIGINT) AS recompute_burden
"""


def agent_breakdown(
    requests: pa.Table,
    fit: PrefillFit | None = None,
    low_hit: float = LOW_HIT,
    small_share: float = SMALL_SHARE,
    calls: pa.Table | None = None,
) -> pa.Table:
    """RQ6 per agent, summed over all workflows of the run.

    Columns: agent_id, calls, failed, call_ms, queue_ms, prefill_ms, ttft_unsplit_ms, decode_ms,
    call_other_ms, failed_ms, tool_ms, other_ms, cache_miss_ms (null unless provenance was
    measured), cache_miss_calls (calls with a cache_miss_ms), path_ms (the agent's time: the
    components summed over its calls), critical_path_ms (the part of it on the workflows'
    critical paths; equal for sequential workflows), weighted_hit_ratio, recompute_burden,
    share (path_ms / all agents' path_ms), and flag: "low hit, small share" (hit ratio below
    `low_hit`, share below `small_share`: misses that cost the workflow little),
    "low hit, large share" (misses where they matter), else "".
    `calls`: `call_rows(requests, fit)` where the caller has it already (a 100k-call run's: ~1 s).
    """
    rows = call_rows(requests, fit) if calls is None else calls
    sql = f"""
    WITH a AS (SELECT {_sums("agent_id")} FROM rows GROUP BY agent_id)
    SELECT *, path_ms / nullif(sum(path_ms) OVER (), 0) AS share FROM a
    ORDER BY {order_sql(table_order(requests))}
    """
    table = query(sql, rows=rows)
    flags = [
        _flag(h, s, low_hit, small_share)
        for h, s in zip(
            table["weighted_hit_ratio"].to_pylist(), table["share"].to_pylist(), strict=True
        )
    ]
    return table.append_column("flag", pa.array(flags, pa.string()))


def _flag(hit: float | None, share: float | None, low_hit: float, small_share: float) -> str:
    if hit is None or share is None or hit >= low_hit:
        return ""
    return "low hit, small share" if share < small_share else "low hit, large share"


def workflow_breakdown(
    requests: pa.Table, fit: PrefillFit | None = None, calls: pa.Table | None = None
) -> pa.Table:
    """RQ6 per workflow: its calls plus tool and other time, and its critical path.

    Columns: workflow_run_id, calls, failed, call_ms, the COMPONENTS sums, cache_miss_ms,
    cache_miss_calls, path_ms (all its calls' time, parallel branches summed), critical_path_ms
    (the chain that ended last), weighted_hit_ratio, recompute_burden, wall_ms (last end - first
    start), slowest_agent (the agent with the most time in this workflow). `calls`: as
    agent_breakdown's.
    """
    rows = call_rows(requests, fit) if calls is None else calls
    per_agent = _OWN
    sql = f"""
    WITH w AS (
      SELECT {_sums("workflow_run_id")},
        (max(end_ns) - min(start_ns)) / 1e6 AS wall_ms
      FROM rows GROUP BY workflow_run_id
    ),
    wa AS (
      SELECT workflow_run_id, agent_id, sum({per_agent}) AS t FROM rows
      GROUP BY workflow_run_id, agent_id
    )
    SELECT w.*, (SELECT arg_max(agent_id, t) FROM wa WHERE wa.workflow_run_id = w.workflow_run_id)
      AS slowest_agent
    FROM w ORDER BY workflow_run_id
    """
    return query(sql, rows=rows)
