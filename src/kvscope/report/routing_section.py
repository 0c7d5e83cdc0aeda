"""The report's routing section: a deployment's run (replicas behind a router), per agent.

Absent for a run of one engine (no row has a replica). From analysis.replica_use: per agent x
replica the calls and weighted hit ratio; per agent its affinity; routing-miss tokens per agent
and per transition beside the uncached causes provenance gives; and a figure of the calls each
replica started over time.
"""

from collections import defaultdict
from collections.abc import Sequence

import matplotlib.pyplot as plt
import pyarrow as pa

from kvscope.analysis import replica_use
from kvscope.analysis.run import RunAnalysis
from kvscope.records.base import Row
from kvscope.report.plots import data_uri
from kvscope.report.table import Column, Section, table

BUCKETS = 30  # time buckets of the load figure

PER_REPLICA = (
    Column("agent_id", "agent", "text"), Column("replica", "replica", "text"),
    Column("calls", "calls"), Column("failed", "failed"),
    Column("prompt_tokens", "prompt tokens"), Column("cached_tokens", "cached tokens"),
    Column("weighted_hit_ratio", "weighted hit ratio", "ratio"),
)  # fmt: skip
AFFINITY = (
    Column("agent_id", "agent", "text"), Column("calls", "calls placed"),
    Column("replicas", "replicas used"), Column("top_replica", "top replica", "text"),
    Column("affinity", "affinity", "ratio"),
    Column("workflow_affinity", "per-workflow affinity", "ratio"),
)  # fmt: skip
MISSES = (
    Column("group", "agent / transition", "text"), Column("calls", "calls"),
    Column("miss_calls", "calls with a routing miss"),
    Column("uncached_tokens", "uncached tokens"),
    Column("routing_miss_tokens", "routing-miss tokens"),
    Column("routing_miss_share", "of prompt tokens", "ratio"),
)  # fmt: skip
INTRO = (
    "The calls went to several replicas behind a router. A routing miss is a prompt token "
    "computed on the call's replica that another replica held at that moment (the KV events "
    "of every replica, each its own cache): what a router that knew every cache would have "
    "saved. It overlaps the uncached causes above (evicted, layout, cold on this replica). "
    "Affinity is the share of an agent's calls on its most used replica."
)


def routing_section(run: RunAnalysis) -> list[Section]:
    if not run.deployed:
        return []
    rows = run.requests.to_pylist()
    unplaced = sum(r.get("replica") is None for r in rows)
    notes = [f"{unplaced} call(s) could not be placed on a replica."] if unplaced else []
    tables = [
        table(replica_use.as_table(replica_use.per_agent_replica(rows)), PER_REPLICA,
              "per agent x replica"),
        table(replica_use.as_table(replica_use.affinity(rows)), AFFINITY, "affinity per agent"),
        table(replica_use.as_table(replica_use.routing_by_agent(rows)), MISSES,
              "routing misses per agent"),
        table(replica_use.as_table(replica_use.routing_by_transition(rows)), MISSES,
              "routing misses per transition (previous agent -> agent)"),
    ]  # fmt: skip
    figure = load_figure(rows)
    return [Section("routing", "Routing", INTRO, figure, "no call to plot", tables, notes)]


def load_figure(rows: list[Row]) -> str | None:
    """Calls started per time bucket, one line per replica."""
    placed = [r for r in rows if r.get("replica") and r.get("start_ns") is not None]
    if not placed:
        return None
    t0 = min(r["start_ns"] for r in placed)
    span = max(r["start_ns"] for r in placed) - t0
    bucket = max(span // BUCKETS + 1, 1)
    counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for load in replica_use.replica_load(placed, bucket):
        counts[load.replica][load.bucket_start_ns] += load.calls
    fig, ax = plt.subplots(figsize=(8, 2.8))
    for replica, by_bucket in sorted(counts.items(), key=lambda kv: (len(kv[0]), kv[0])):
        xs = sorted(by_bucket)
        ax.step([(x - t0) / 1e9 for x in xs], [by_bucket[x] for x in xs], where="post",
                label=replica)  # fmt: skip
    ax.set_xlabel(f"seconds since the first call (buckets of {bucket / 1e9:.1f} s)")
    ax.set_ylabel("calls started")
    ax.set_title("load each replica carried", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return data_uri(fig)


def routing_compare(data: Sequence[RunAnalysis]) -> list[Section]:
    """Across deployment runs (a sweep over router policies): per run its routing-miss tokens
    and hit ratio, per run and agent its routing misses and affinity; [] when no run has one."""
    per_run: list[Row] = []
    per_agent: list[Row] = []
    for d in data:
        if not d.deployed:
            continue
        rows = d.requests.to_pylist()
        router = (d.config.get("deployment") or {}).get("router") or {}
        whole = replica_use.routing_sum("all", rows)
        per_run.append({
            "run": d.label, "router": f"{router.get('kind', '?')} {router.get('policy', '?')}",
            "calls": len(rows), "unplaced": sum(r.get("replica") is None for r in rows),
            "weighted_hit_ratio": d.total.weighted_hit_ratio,
            "routing_miss_tokens": whole.routing_miss_tokens,
            "routing_miss_share": whole.routing_miss_share,
        })  # fmt: skip
        misses = {m.group: m for m in replica_use.routing_by_agent(rows)}
        for aff in replica_use.affinity(rows):
            m = misses.get(aff.agent_id or "none")
            per_agent.append({
                "run": d.label, "agent_id": aff.agent_id, "affinity": aff.affinity,
                "routing_miss_tokens": m.routing_miss_tokens if m else None,
                "routing_miss_share": m.routing_miss_share if m else None,
            })  # fmt: skip
    if not per_run:
        return []
    runs_cols = (
        Column("run", "run", "text"), Column("router", "router", "text"),
        Column("calls", "calls"), Column("unplaced", "unplaced calls"),
        Column("weighted_hit_ratio", "weighted hit ratio", "ratio"),
        Column("routing_miss_tokens", "routing-miss tokens"),
        Column("routing_miss_share", "of prompt tokens", "ratio"),
    )  # fmt: skip
    agent_cols = (
        Column("run", "run", "text"), Column("agent_id", "agent", "text"),
        Column("affinity", "affinity", "ratio"),
        Column("routing_miss_tokens", "routing-miss tokens"),
        Column("routing_miss_share", "of prompt tokens", "ratio"),
    )  # fmt: skip
    tables = [
        table(pa.Table.from_pylist(per_run), runs_cols, "per run"),
        table(pa.Table.from_pylist(per_agent), agent_cols, "per run and agent"),
    ]
    return [Section("routing", "Routing across runs", INTRO, tables=tables)]
