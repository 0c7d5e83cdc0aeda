"""Every analysis of one run, computed once: `analyze_run(run_dir) -> RunAnalysis`.

The run's tables (finalize) are the only input; the terminal summary, summary.json, MLflow and
report.html all render the one RunAnalysis, so they cannot disagree. A view whose data the run
lacks is None or empty (no /metrics series, no KV events), never zeros.
"""

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kvscope.analysis import evictions, latency, provenance, replica_use, transitions, turns
from kvscope.analysis.agents import AgentSummary, as_table, overall, per_agent
from kvscope.analysis.evictions import Residency, TransitionHarm
from kvscope.analysis.predictability import Predictability, predictability
from kvscope.analysis.reconcile import Reconciliation, counter_values, reconcile
from kvscope.analysis.reconcile import evictions as reconciled_evictions
from kvscope.analysis.server import (
    ReplicaServer,
    deployment_summary,
    replica_servers,
    server_summary,
)
from kvscope.analysis.server_agents import COUNTERS, per_agent_server
from kvscope.analysis.time_split import TimeSplit, time_split
from kvscope.collect.series import counter_delta
from kvscope.records import metrics
from kvscope.records.agents import agent_order
from kvscope.records.base import Row
from kvscope.records.finalized import Finalized, KvReport
from kvscope.records.metrics import ScrapeSummary, Series
from kvscope.records.run_dir import RunDir


@dataclass(frozen=True)
class RunAnalysis:
    """One run directory, read and analysed (RQ1, RQ2, RQ6, Level 2 and Level 3)."""

    run_dir: Path
    label: str
    run: dict[str, Any]  # run.json ({} for a run directory without one)
    requests: pa.Table  # every canonical column (an older run's missing ones are null)
    finalized: Finalized | None  # finalize.json: torn lines, KV event counts
    order: list[str | None]  # agents.agent_order: the run's agents by first appearance
    # RQ1: per agent, per agent x turn, where the prompt tokens came from (Level 3)
    agents: list[AgentSummary]
    total: AgentSummary
    turns: pa.Table
    provenance: dict[str, dict[str, int]]
    # RQ2: per transition
    transitions: pa.Table
    # which agent comes next: sequences, reuse distance, next-agent predictor
    predictability: Predictability
    # RQ6: where workflow time goes
    fit: latency.PrefillFit | None
    calls: pa.Table
    latency: pa.Table
    workflows: pa.Table
    # Level 2: the engine's /metrics
    series: Series  # kvscope's instant values over time
    scrape: ScrapeSummary | None  # the sampler's numbers; None when it wrote no series
    scrape_error: str | None  # the sampler's own failure, as the capture recorded it
    server: dict[str, float]  # one engine's; a deployment's: what adds up over its replicas
    replicas: list[ReplicaServer]  # a deployment's replicas, each its own /metrics; [] for one
    server_agents: dict[str, dict[str, float | None]]  # SGLang's `agent` metric label
    reconciliation: list[Reconciliation]
    time_split: list[TimeSplit]  # client / engine front end / core
    # Level 3: the block table; None without KV events
    blocks: pa.Table | None  # blocks.parquet
    evictions: pa.Table | None  # evictor x victim
    harm: list[TransitionHarm]
    residency: list[Residency]

    @property
    def benchmark_run_id(self) -> str:
        return str(self.run.get("benchmark_run_id") or self.run_dir.name)

    @property
    def config(self) -> dict[str, Any]:
        return self.run.get("config") or {}

    @property
    def kv(self) -> KvReport | None:
        return self.finalized.kv if self.finalized else None

    @property
    def rows(self) -> int:
        return self.requests.num_rows

    @property
    def kv_capacity_config(self) -> int | None:
        return (self.config.get("engine") or {}).get("kv_capacity_tokens")

    @property
    def kv_capacity(self) -> int | None:
        """The configured KV capacity, else the one the engine reported in /metrics."""
        measured = self.series.get("kv_capacity_tokens")
        if self.kv_capacity_config is not None:
            return int(self.kv_capacity_config)
        return int(measured[-1][1]) if measured else None

    @property
    def deployed(self) -> bool:
        """A deployment's run: some call has a replica (a non-empty `replica`; an older run's
        table may have no such column)."""
        if "replica" not in self.requests.column_names:
            return False
        return bool(pc.any(pc.not_equal(self.requests.column("replica"), "")).as_py())

    @property
    def concurrency(self) -> int | None:
        return (self.config.get("workload") or {}).get("concurrency")

    def agent_table(self) -> pa.Table:
        """`agents` as a table (AgentSummary's fields as columns)."""
        return as_table(self.agents)

    def eviction_summary(self) -> dict[str, float | None]:
        """Run-level eviction numbers (blocks evicted, harm, per evictor -> victim pair)."""
        return evictions.summary(self.blocks) if self.blocks is not None else {}

    def summary(self) -> dict[str, Any]:
        """summary.json."""
        return (
            {
                "status": self.run.get("status"),  # how the run ended (records/status.py)
                "agents": [asdict(a) for a in self.agents],
                "total": asdict(self.total),
                "server": self.server,
                "server_agents": self.server_agents,
                "scrape_error": self.scrape_error,
                "reconciliation": [r.to_dict() for r in self.reconciliation],
                "time_split": [t.to_dict() for t in self.time_split],
                "predictability": self.predictability.summary(),
                "kv_events": asdict(self.kv) if self.kv else None,
                "evictions": {
                    "summary": self.eviction_summary(),
                    "matrix": self.evictions.to_pylist() if self.evictions is not None else [],
                    "by_transition": [asdict(t) for t in self.harm],
                    "residency": [asdict(r) for r in self.residency],
                }
                if self.blocks is not None
                else None,
            }
            | self.routing_summary()
            | self.replica_summary()
        )

    def replica_summary(self) -> dict[str, Any]:
        """{"server_replicas": {name: ...}} for a deployment's run; {} for one engine."""
        if not self.replicas:
            return {}
        return {"server_replicas": {r.name: r.to_dict() for r in self.replicas}}

    def routing_summary(self) -> dict[str, Any]:
        """{"routing": ...} for a deployment's run (a row has a replica); {} for one engine."""
        if not self.deployed:
            return {}
        rows = self.requests.to_pylist()
        return {
            "routing": {
                "unplaced_calls": sum(r.get("replica") is None for r in rows),
                "per_agent_replica": [asdict(x) for x in replica_use.per_agent_replica(rows)],
                "affinity": [asdict(x) for x in replica_use.affinity(rows)],
                "by_agent": [asdict(x) for x in replica_use.routing_by_agent(rows)],
                "by_transition": [asdict(x) for x in replica_use.routing_by_transition(rows)],
            }
        }


def named_samples(table: pa.Table) -> list[Row]:
    """The metrics.parquet rows the analyses read (server_agents: its counters and latency
    histograms; time_split: the latency histograms, kvscope names ending in "_seconds"), and
    the run's first sample, where a series first seen later starts at 0
    (collect.series.series_deltas): a 100k-call run's 3.4 M rows as 50k dicts, not 3.4 M."""
    if table.num_rows == 0:
        return []
    name = table.column("kvscope_name")
    first = pc.equal(table.column("timestamp_ns"), pc.min(table.column("timestamp_ns")))
    read = pc.or_(pc.is_in(name, pa.array(list(COUNTERS))), pc.ends_with(name, "_seconds"))
    return table.filter(pc.or_(pc.fill_null(read, False), first)).to_pylist()


def analyze_run(run: RunDir | Path, label: str | None = None) -> RunAnalysis:
    """Read a finalized run directory and run every per-run analysis once."""
    run = RunDir.open(run)
    run_dir, info, table = run.path, run.info, run.requests
    rows = table.to_pylist()
    metrics_table = run.metrics
    metric_rows = named_samples(metrics_table) if metrics_table is not None else []
    series = metrics.load_series(run_dir)
    sampled = metrics_table is not None or (run_dir / metrics.METRICS_JSONL).exists()
    gaps = run_dir / metrics.METRICS_GAPS
    blocks = run.blocks
    fit = latency.fit_prefill_cost(table)
    servers = replica_servers(run_dir, rows)
    checks = reconcile(rows, counter_values(series), counter_delta) if sampled else []
    if sampled and (evicted := reconciled_evictions(blocks, series, counter_delta)):
        checks.append(evicted)
    order = agent_order(rows)
    calls = latency.call_rows(table, fit)  # once: the per-agent and per-workflow views read it
    return RunAnalysis(
        run_dir=run_dir,
        label=label or run_dir.name,
        run=info,
        requests=table,
        finalized=Finalized.read(run_dir),
        order=order,
        agents=per_agent(rows),
        total=overall(rows),
        turns=turns.agent_turns(table, order),
        provenance=provenance.by_agent(rows),
        transitions=transitions.transitions(table, order),
        predictability=predictability(rows),
        fit=fit,
        calls=calls,
        latency=latency.agent_breakdown(table, fit, calls=calls),
        workflows=latency.workflow_breakdown(table, fit, calls),
        series=series,
        scrape=metrics.read_gaps(gaps)[0] if gaps.exists() else None,
        scrape_error=(info.get("capture") or {}).get("scrape_error"),
        server=deployment_summary(servers) if servers else server_summary(series),
        replicas=servers,
        server_agents=per_agent_server(metric_rows),
        reconciliation=[c for s in servers for c in s.reconciliation] if servers else checks,
        time_split=time_split(rows, metric_rows),
        blocks=blocks,
        evictions=evictions.matrix(blocks, order) if blocks is not None else None,
        harm=evictions.by_transition(blocks) if blocks is not None else [],
        residency=evictions.residency(blocks, order) if blocks is not None else [],
    )
