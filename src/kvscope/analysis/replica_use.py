"""Several replicas behind a router: where each agent's calls went and what routing cost them.

Pure functions over request rows (dicts with RequestRecord's keys; `replica` names the replica
that served the call, None when unknown; `routing_miss_tokens` as finalize.routing_misses fills it).

- `per_agent_replica`: per (agent, replica): calls, failed, measured calls, prompt and cached
  tokens, weighted hit ratio (agents.weighted_hit_ratio: sum cached / sum prompt over measured
  rows; None where nothing was measured).
- `affinity`: per agent: calls with a known replica, the replica most of them went to, its share
  (affinity; None when no call has a replica) and `workflow_affinity`, the same share taken per
  workflow run (an agent's prefix is usually per workflow, so a router that keeps each workflow's
  agent on one replica scores 1 there even when workflows are spread).
- `replica_load`: per time bucket, replica and agent: calls started and their prompt tokens.
- `routing_by_agent` / `routing_by_transition`: routing-miss tokens (prompt tokens uncached on
  the call's replica but cached on another at that moment, finalize.routing_misses) summed per agent
  and per handoff edge (previous_agent_id -> agent_id, "start" edges first), with call counts;
  sums are over measured calls with a routing-miss value and None when there is none.
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from kvscope.analysis.agents import weighted_hit_ratio
from kvscope.records.agents import agent_key, agent_order, transition_label
from kvscope.records.base import Row
from kvscope.records.requests import STATUS_OK

MISS = "routing_miss_tokens"  # the per-call column finalize.routing_misses fills


def _measured(r: Row) -> bool:
    return (
        r.get("status") == STATUS_OK
        and r.get("cached_tokens") is not None
        and r.get("prompt_tokens") is not None
    )


@dataclass(frozen=True)
class AgentReplica:
    agent_id: str | None
    replica: str | None
    calls: int
    failed: int
    measured: int
    prompt_tokens: int | None  # over measured calls; None when none
    cached_tokens: int | None
    weighted_hit_ratio: float | None


def per_agent_replica(rows: Sequence[Row]) -> list[AgentReplica]:
    """One row per (agent, replica) that occurs: agents in agent_order, replicas by name
    (None, a call whose replica is unknown, last)."""
    groups: dict[tuple[str | None, str | None], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r.get("agent_id"), r.get("replica"))].append(r)
    key = agent_key(agent_order(rows))
    out = []
    for (agent, replica), rs in sorted(
        groups.items(), key=lambda kv: (key(kv[0][0]), kv[0][1] is None, kv[0][1] or "")
    ):
        known = [r for r in rs if _measured(r)]
        out.append(
            AgentReplica(
                agent_id=agent,
                replica=replica,
                calls=len(rs),
                failed=sum(r.get("status") != STATUS_OK for r in rs),
                measured=len(known),
                prompt_tokens=sum(r["prompt_tokens"] for r in known) if known else None,
                cached_tokens=sum(r["cached_tokens"] for r in known) if known else None,
                weighted_hit_ratio=weighted_hit_ratio(known),
            )
        )
    return out


@dataclass(frozen=True)
class Affinity:
    agent_id: str | None
    calls: int  # calls with a known replica
    replicas: int  # distinct replicas its calls went to
    top_replica: str | None  # ties: the name first in sort order
    top_calls: int
    affinity: float | None  # top_calls / calls
    workflow_affinity: float | None  # sum over workflows of their top calls / calls


def affinity(rows: Sequence[Row]) -> list[Affinity]:
    """Per agent (agent_order), over its calls whose replica is known (failed ones included:
    the router placed them too)."""
    out = []
    for agent in agent_order(rows):
        placed = [r for r in rows if r.get("agent_id") == agent and r.get("replica") is not None]
        top, top_calls = _top([r["replica"] for r in placed])
        per_wf: dict[Any, list[str]] = defaultdict(list)
        for r in placed:
            per_wf[r.get("workflow_run_id")].append(r["replica"])
        wf_top = sum(_top(reps)[1] for reps in per_wf.values())
        n = len(placed)
        out.append(
            Affinity(
                agent_id=agent,
                calls=n,
                replicas=len({r["replica"] for r in placed}),
                top_replica=top,
                top_calls=top_calls,
                affinity=top_calls / n if n else None,
                workflow_affinity=wf_top / n if n else None,
            )
        )
    return out


def _top(replicas: Iterable[str]) -> tuple[str | None, int]:
    counts: dict[str, int] = defaultdict(int)
    for rep in replicas:
        counts[rep] += 1
    if not counts:
        return None, 0
    best = min(counts, key=lambda rep: (-counts[rep], rep))
    return best, counts[best]


@dataclass(frozen=True)
class Load:
    bucket_start_ns: int
    replica: str
    agent_id: str | None
    calls: int  # calls started in the bucket
    prompt_tokens: int | None  # theirs, where reported; None when none was


def replica_load(rows: Sequence[Row], bucket_ns: int) -> list[Load]:
    """Calls started per [t0 + k * bucket_ns, t0 + (k + 1) * bucket_ns) (t0: the first start)
    per replica and agent; rows without a replica are left out. Sorted by bucket, replica,
    agent (agent_order)."""
    if bucket_ns <= 0:
        raise ValueError("bucket_ns must be positive")
    placed = [r for r in rows if r.get("replica") is not None]
    if not placed:
        return []
    t0 = min(r["start_ns"] for r in placed)
    groups: dict[tuple[int, str, str | None], list[Row]] = defaultdict(list)
    for r in placed:
        k = t0 + (r["start_ns"] - t0) // bucket_ns * bucket_ns
        groups[(k, r["replica"], r.get("agent_id"))].append(r)
    key = agent_key(agent_order(rows))
    out = []
    for (k, rep, agent), rs in sorted(groups.items(), key=lambda kv: (*kv[0][:2], key(kv[0][2]))):
        prompts = [r["prompt_tokens"] for r in rs if r.get("prompt_tokens") is not None]
        out.append(Load(k, rep, agent, len(rs), sum(prompts) if prompts else None))
    return out


@dataclass(frozen=True)
class RoutingSum:
    group: str  # the agent id ("none" for calls without one), or a transition label
    calls: int
    measured: int  # calls with a routing miss value
    miss_calls: int  # of those, with routing-miss tokens > 0
    prompt_tokens: int | None  # over measured calls
    uncached_tokens: int | None
    routing_miss_tokens: int | None
    routing_miss_share: float | None  # routing_miss_tokens / prompt_tokens


def routing_by_agent(rows: Sequence[Row]) -> list[RoutingSum]:
    """Per agent (agent_order) the routing-miss totals."""
    key = agent_key(agent_order(rows))
    agents = sorted({r.get("agent_id") for r in rows}, key=key)
    return [routing_sum(a or "none", [r for r in rows if r.get("agent_id") == a]) for a in agents]


def routing_by_transition(rows: Sequence[Row]) -> list[RoutingSum]:
    """Per handoff edge `previous -> agent` (start edges first, then by the agents' order)."""
    key = agent_key(agent_order(rows))
    groups: dict[tuple[str | None, str | None], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r.get("previous_agent_id"), r.get("agent_id"))].append(r)

    def order(edge: tuple[str | None, str | None]) -> tuple[bool, Any, Any]:
        return (edge[0] is not None, key(edge[0]), key(edge[1]))

    edges = sorted(groups, key=order)
    return [routing_sum(transition_label(p, str(a)), groups[(p, a)]) for p, a in edges]


def routing_sum(group: str, rows: list[Row]) -> RoutingSum:
    got = [(r, m) for r in rows if (m := r.get(MISS)) is not None and _measured(r)]

    def total(values: Iterable[int]) -> int | None:
        return sum(values) if got else None

    prompt = total(r["prompt_tokens"] for r, _ in got)
    missed = total(m for _, m in got)
    return RoutingSum(
        group=group,
        calls=len(rows),
        measured=len(got),
        miss_calls=sum(m > 0 for _, m in got),
        prompt_tokens=prompt,
        uncached_tokens=total(max(r["prompt_tokens"] - r["cached_tokens"], 0) for r, _ in got),
        routing_miss_tokens=missed,
        routing_miss_share=missed / prompt if prompt and missed is not None else None,
    )


def as_table(items: Sequence[Any]) -> pa.Table:
    """Dataclass rows (any of this module's) as an Arrow table; an empty table has no columns."""
    return pa.Table.from_pylist([asdict(x) for x in items])
