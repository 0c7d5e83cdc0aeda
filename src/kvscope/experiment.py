"""One configuration, end to end: engine -> workload -> request table -> MLflow run.

What was measured is kept whatever happens: rows are on disk as each call ends, and the
Parquet table, the summary and the MLflow run are written also after a failure or Ctrl-C.
"""

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import yaml
from prometheus_client.metrics_core import Metric

from kvscope import environment, finalize, store
from kvscope.analysis import evictions, provenance
from kvscope.analysis.agents import AgentSummary, overall, per_agent
from kvscope.analysis.evictions import TransitionHarm
from kvscope.analysis.reconcile import Reconciliation, reconcile
from kvscope.analysis.server_agents import per_agent_server
from kvscope.analysis.time_split import TimeSplit, time_split
from kvscope.analysis.time_split import as_dict as split_dict
from kvscope.collect.kv_events import KvEventListener, summary_dict
from kvscope.collect.metrics import ScrapeSummary
from kvscope.collect.scraper import MetricsScraper
from kvscope.collect.series import counter_delta
from kvscope.config import ExperimentConfig, config_hash
from kvscope.engines import ENGINES, METRIC_FAMILIES, make_engine
from kvscope.engines.base import Engine
from kvscope.engines.detect import detect, fetch_metrics
from kvscope.engines.runtime import reset_cache, running
from kvscope.errors import ConfigError, EngineError
from kvscope.probe.client import Probe, RunInfo
from kvscope.probe.runtime import ProfiledRuntime
from kvscope.probe.tokens import ChatTokenizer
from kvscope.probe.tracing import TraceAudit, Tracer, TrackingRun
from kvscope.report import plots, timeline
from kvscope.report.html import REPORT_HTML, run_report
from kvscope.workload import peer, prompts


@dataclass
class Hooks:
    """Progress callbacks for the CLI (all optional)."""

    on_stage: Callable[[str], None] = lambda _: None
    on_call: Callable[[], None] = lambda: None
    on_workflow_done: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class RunOutcome:
    benchmark_run_id: str
    run_dir: Path
    rows: int
    skipped_lines: int
    agents: list[AgentSummary]
    total: AgentSummary
    workflows: list[peer.WorkflowResult]
    mlflow_run_id: str | None
    tracking_uri: str | None
    audit: TraceAudit | None
    error: str | None = None
    reconciliation: list[Reconciliation] = field(default_factory=list)
    scrape: ScrapeSummary | None = None
    scrape_error: str | None = None  # the /metrics scraper's own failure; its JSONL is kept
    server: dict[str, float] = field(default_factory=dict)  # run-level /metrics summaries
    server_agents: dict[str, dict[str, float]] = field(default_factory=dict)  # SGLang agent label
    kv: finalize.KvReport | None = None  # Level 3: KV events received and their gaps
    provenance: dict[str, dict[str, int]] = field(default_factory=dict)  # per agent
    evictions: list[dict[str, Any]] = field(default_factory=list)  # evictor x victim rows
    harm: list[TransitionHarm] = field(default_factory=list)
    time_split: list[TimeSplit] = field(default_factory=list)  # client / front end / core


def run_experiment(cfg: ExperimentConfig, hooks: Hooks | None = None) -> RunOutcome:
    hooks = hooks or Hooks()
    _check(cfg)
    runs_dir = cfg.runs_dir.resolve()
    runs_dir.mkdir(parents=True, exist_ok=True)
    run_id, run_dir = store.new_run(runs_dir, cfg.name)
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    )
    engine = make_engine(cfg.engine)
    results: list[peer.WorkflowResult] = []
    tracking: TrackingRun | None = None
    scraper: MetricsScraper | None = None
    listener: KvEventListener | None = None
    failure: BaseException | None = None
    hooks.on_stage(f"starting {engine.name}")
    try:
        with running(engine, run_dir / "engine.log") as handle:
            hooks.on_stage("detecting engine capabilities")
            caps = detect(handle.endpoints, METRIC_FAMILIES)
            facts: dict[str, Any] = {}
            if caps.family:
                families = _metric_families(handle.endpoints.metrics_url)
                facts = ENGINES[caps.family].runtime_facts(families)
            cache_reset = _cold_start(cfg, engine, handle.endpoints.base_url)
            env = environment.collect(
                engine, launch=handle.launch, capabilities=caps, runtime=facts
            )
            run_json = {
                "benchmark_run_id": run_id,
                "configuration_hash": config_hash(cfg),
                "config": cfg.model_dump(mode="json"),
                "launch_command": handle.launch.shell() if handle.launch else None,
                "cache_reset": cache_reset,
                "environment": env,
            }
            (run_dir / store.RUN_JSON).write_text(json.dumps(run_json, indent=2, default=str))
            (run_dir / "environment.json").write_text(json.dumps(env, indent=2, default=str))
            (run_dir / "launch_command.txt").write_text((run_json["launch_command"] or "") + "\n")
            hooks.on_stage("opening the MLflow run")
            tracking = TrackingRun.open(cfg.tracking, runs_dir)
            tracking.start(run_id, _params(cfg, caps.models[0], engine.version(), facts, env), {
                "benchmark_run_id": run_id, "engine": engine.name,
            })  # fmt: skip
            info = RunInfo(
                experiment_name=cfg.tracking.experiment,
                configuration_hash=config_hash(cfg),
                workflow_type=cfg.workload.workflow,
                workflow_concurrency=cfg.workload.concurrency,
                model_name=caps.models[0],
                chat_template_name=_template_name(env),
            )
            log = store.RequestLog(run_dir / store.REQUESTS_JSONL)
            chat = _chat_tokenizer(engine)
            token_log = finalize.TokenLog(run_dir / finalize.TOKENS_JSONL) if chat else None

            def sink(record: Any) -> None:
                log.append(record)
                hooks.on_call()

            probe = Probe(
                engine, handle.endpoints.base_url, info,
                timeout_s=cfg.workload.request_timeout_s, sink=sink, tokens=chat,
                token_sink=token_log.append if token_log else None,
                store_prompts=cfg.workload.store_prompts,
            )  # fmt: skip
            runtime = ProfiledRuntime(probe, Tracer(enabled=cfg.tracking.traces), "peer")
            tokenizer = _tokenizer(engine) if cfg.workload.mode == "synthetic" else None
            if caps.family and caps.metrics and handle.endpoints.metrics_url:
                scraper = MetricsScraper(
                    ENGINES[caps.family], handle.endpoints.metrics_url, run_id,
                    interval_s=cfg.metrics_interval_s,
                    instant_path=run_dir / finalize.METRICS_JSONL,
                )  # fmt: skip
                scraper.start()  # its first sample precedes the first request
            ep = handle.endpoints
            if caps.kv_events and ep.kv_events:
                listener = KvEventListener(
                    ep.kv_events, run_dir / finalize.KV_EVENTS_JSONL,
                    bind=ep.kv_events_subscriber_binds, replay_endpoint=ep.kv_events_replay,
                )  # fmt: skip
                listener.start()  # connected before the first request
            hooks.on_stage("running workflows")
            try:
                results = asyncio.run(_drive(runtime, cfg, run_id, tokenizer, hooks, probe))
            finally:
                log.close()
                if token_log is not None:
                    token_log.close()
                if scraper is not None:
                    scraper.stop()
                if listener is not None:
                    summary = listener.stop()
                    (run_dir / finalize.KV_SUMMARY).write_text(
                        json.dumps(summary_dict(summary), indent=2) + "\n"
                    )
    except (Exception, KeyboardInterrupt, SystemExit) as err:  # SystemExit: SIGTERM
        if tracking is None:  # nothing was measured yet: nothing to keep
            raise
        failure = err
    outcome = _close(
        run_id, run_dir, results, tracking, scraper, engine, hooks, failure, cfg.tracking.traces
    )
    if isinstance(failure, KeyboardInterrupt | SystemExit):
        raise failure
    return outcome


def _metric_families(url: str | None) -> list[Metric]:
    with httpx.Client(timeout=10) as client:
        return fetch_metrics(client, url) or []


async def _drive(runtime: ProfiledRuntime, cfg: ExperimentConfig, run_id: str, tokenizer: Any,
                 hooks: Hooks, probe: Probe) -> list[peer.WorkflowResult]:  # fmt: skip
    try:
        return await peer.run_workflows(
            runtime, cfg.workload, run_id, tokenizer=tokenizer,
            on_workflow_done=lambda _: hooks.on_workflow_done(),
        )  # fmt: skip
    finally:
        await probe.close()


ARTIFACTS = (
    store.REQUESTS_PARQUET, "config.yaml", "launch_command.txt", "environment.json",
    store.RUN_JSON, "summary.json", "engine.log", finalize.METRICS_PARQUET, "metrics.gaps.json",
    "timeline.png", finalize.KV_EVENTS_PARQUET, finalize.BLOCKS_PARQUET, finalize.KV_SUMMARY,
    "evictions.png", REPORT_HTML,
)  # fmt: skip


def _close(
    run_id: str,
    run_dir: Path,
    results: list[peer.WorkflowResult],
    tracking: TrackingRun,
    scraper: MetricsScraper | None,
    engine: Engine,
    hooks: Hooks,
    failure: BaseException | None,
    traces: bool,
) -> RunOutcome:
    """Table, summary and MLflow run from whatever was measured (also after a failure)."""
    hooks.on_stage("writing the request table")
    server_agents: dict[str, dict[str, float]] = {}
    series_rows: list[dict[str, Any]] = []
    if scraper is not None:
        scraper.write(run_dir / finalize.METRICS_PARQUET)
        series_rows = scraper.table().to_pylist()
        server_agents = per_agent_server(series_rows)
    # SGLang: its request-metrics export, by rid
    tables = finalize.finalize(run_dir, engine.exported_timings())
    table, skipped, series = tables.rows, tables.skipped_lines, tables.series
    rows = len(table)
    evicted = evictions.summary(tables.blocks) if tables.kv else {}
    pairs = (
        evictions.matrix(pa.Table.from_pylist(tables.blocks, schema=finalize.BLOCKS_SCHEMA))
        .to_pylist() if tables.kv else []
    )  # fmt: skip
    if pairs:
        plots.write_png(plots.eviction_heatmap(pa.Table.from_pylist(pairs)),
                        run_dir / "evictions.png")  # fmt: skip
    agents, total = per_agent(table), overall(table)
    counters = {name: [v for _, v in pts] for name, pts in series.items()}
    recon = reconcile(table, counters, counter_delta) if scraper is not None else []
    server = _server_summary(series)
    splits = time_split(table, series_rows)
    split_rows = [split_dict(t) for t in splits]
    if table:
        timeline.plot(table, series, run_dir / "timeline.png", f"{run_id}: KV cache and calls")
    summary = {
        "agents": [asdict(a) for a in agents], "total": asdict(total), "server": server,
        "server_agents": server_agents,
        "scrape_error": scraper.error if scraper else None,
        "reconciliation": [asdict(r) | {"difference": r.difference} for r in recon],
        "time_split": split_rows,
        "kv_events": asdict(tables.kv) if tables.kv else None,
        "evictions": {
            "summary": evicted,
            "matrix": pairs,
            "by_transition": [asdict(t) for t in evictions.by_transition(tables.blocks)],
            "residency": [asdict(r) for r in evictions.residency(tables.blocks)],
        } if tables.kv else None,
    }  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    hooks.on_stage("writing report.html")
    try:
        run_report(run_dir)
    except Exception as err:  # the tables are written: a report failure must not lose them
        (run_dir / "report.error.txt").write_text(f"{type(err).__name__}: {err}\n")
    hooks.on_stage("logging to MLflow")
    tracking.log_metrics({
        **_metrics(agents, total),
        **{f"server.{k}": v for k, v in server.items()},
        **{f"server.{a}.{k}": v for a, view in server_agents.items() for k, v in view.items()},
        **{f"reconcile.{r.counter}.difference": r.difference for r in recon
           if r.difference is not None},
        **{f"kv.{k}": v for k, v in evicted.items()},
        **{f"time.{d['span']}.{k}": d[k] for d in split_rows
           for k in ("client_ms", "engine_ms", "core_ms", "client_side_ms", "front_end_ms")
           if d[k] is not None},
        **({"kv.missing_batches": float(tables.kv.missing_batches)} if tables.kv else {}),
        "workflows_run": float(len(results)),
        "workflows_failed": float(sum(not r.ok for r in results)),
        "unparsed_verdicts": float(sum(r.unparsed_verdicts for r in results)),
    })  # fmt: skip
    for name in ARTIFACTS:
        if (run_dir / name).exists():
            tracking.log_artifact(run_dir / name)
    # After a failure, the workflows that got as far as a call are the traces to expect.
    expected = len(results) if failure is None else _workflows_started(table)
    if not traces:
        expected = 0
    audit = tracking.finish(expected, status="FINISHED" if failure is None else "FAILED")
    error = None if failure is None else f"{type(failure).__name__}: {failure}".rstrip(": ")
    return RunOutcome(run_id, run_dir, rows, skipped, agents, total, results, tracking.run_id,
                      tracking.tracking_uri, audit, error, recon,
                      scraper.summary() if scraper else None, scraper.error if scraper else None,
                      server, server_agents, tables.kv,
                      provenance.by_agent(table), pairs,
                      evictions.by_transition(tables.blocks), splits)  # fmt: skip


def _server_summary(series: dict[str, list[tuple[int, float]]]) -> dict[str, float]:
    """Run-level /metrics summaries: peak and mean KV use, mean queue, hit rate from counters."""
    out: dict[str, float] = {}
    for name in ("kv_used_tokens", "kv_usage", "running_requests", "queued_requests"):
        values = [v for _, v in series.get(name, ())]
        if values:
            out[f"{name}_peak"] = max(values)
            out[f"{name}_mean"] = sum(values) / len(values)
    prompt = counter_delta(v for _, v in series.get("prompt_tokens_total", ()))
    cached = counter_delta(v for _, v in series.get("cached_tokens_total", ()))
    if prompt and cached is not None:
        out["hit_rate_from_counters"] = cached / prompt
    return out


def _workflows_started(table: list[dict[str, Any]]) -> int:
    return len({r["workflow_run_id"] for r in table})


def _check(cfg: ExperimentConfig) -> None:
    w, e = cfg.workload, cfg.engine
    if w.mode == "synthetic":
        s = w.synthetic
        # one call = chat template (14 tokens for SmolLM2; 32 leaves room) + fixed + dynamic
        need = 32 + s.fixed_tokens + s.dynamic_tokens + s.output_tokens
        if need > e.context_length:
            raise ConfigError(
                f"synthetic prompts need up to {need} tokens but engine.context_length is "
                f"{e.context_length}; shorten the prompt lengths or raise context_length"
            )
    if e.kind == "attach" and w.mode == "synthetic":
        raise ConfigError("synthetic mode needs the model's tokenizer: not available on attach")


def _tokenizer(engine: Any) -> Any:
    from tokenizers import Tokenizer

    path = Path(engine.model_facts().get("path", "")) / "tokenizer.json"
    if not path.exists():
        raise ConfigError(f"synthetic mode needs {path}")
    return Tokenizer.from_file(str(path))


def _cold_start(cfg: ExperimentConfig, engine: Engine, base_url: str) -> str:
    """Empty the prefix cache (an `engine up` engine holds earlier runs' blocks); what happened."""
    if not cfg.cold_start:
        return "kept (cold_start: false)"
    try:
        note = reset_cache(engine, base_url)
    except EngineError as err:
        return f"not reset: {err}"
    return note or "emptied before the workload"


def _chat_tokenizer(engine: Engine) -> ChatTokenizer | None:
    """The model's own tokenizer and chat template, where kvscope can read the model folder."""
    path = engine.model_facts().get("path")
    return ChatTokenizer.from_model_dir(Path(path)) if path and Path(path).is_dir() else None


def _template_name(env: dict[str, Any]) -> str | None:
    digest = env.get("model", {}).get("chat_template_sha256")
    return f"sha256:{digest[:12]}" if digest else None


def _params(cfg: ExperimentConfig, model: str, version: str | None, facts: dict[str, Any],
            env: dict[str, Any]) -> dict[str, object]:  # fmt: skip
    w, e = cfg.workload, cfg.engine
    params: dict[str, object] = {
        "model": model,
        "model_id": env.get("model", {}).get("model_id"),
        "model_revision": env.get("model", {}).get("revision"),
        "serving_engine": e.kind,
        "engine_version": version,
        "launch_command": env["engine"]["launch_command"],
        # dtype: what the engine ran with; why: the rule and the CPU flags (engines/cpu.py)
        "dtype": (env["engine"].get("dtype") or {}).get("dtype"),
        "dtype_reason": (env["engine"].get("dtype") or {}).get("reason"),
        "cpu_isa_flags": ",".join(env.get("cpu", {}).get("isa_flags") or []) or None,
        "prefix_cache": e.prefix_cache,
        "radix_eviction_policy": e.eviction_policy,
        "kv_capacity_tokens_config": e.kv_capacity_tokens,
        "kv_capacity_tokens": facts.get("capacity_tokens"),
        "context_length": e.context_length,
        "workflow": "planner-executor-expresser-reviewer",
        "loop_mode": w.loop,
        "cycles": w.cycles if w.loop == "fixed" else None,
        "max_cycles": w.max_cycles if w.loop == "model" else None,
        "workflows": w.workflows,
        "concurrency": w.concurrency,
        "prompt_mode": w.mode,
        "prompt_layout": w.layout,
        "prompt_sharing": w.sharing if w.mode == "tasks" else None,
        "cold_start": cfg.cold_start,
        "prompt_template_version": prompts.TEMPLATE_VERSION,
        "max_tokens": w.max_tokens if w.mode == "tasks" else w.synthetic.output_tokens,
        "fixed_prompt_tokens": w.synthetic.fixed_tokens if w.mode == "synthetic" else None,
        "dynamic_prompt_tokens": w.synthetic.dynamic_tokens if w.mode == "synthetic" else None,
        "tool": w.tool,
        "random_seed": w.seed,
        "configuration_hash": config_hash(cfg),
    }
    return {k: v for k, v in params.items() if v is not None}


def _metrics(agents: list[AgentSummary], total: AgentSummary) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in [*agents, total]:
        values = {
            "calls": s.calls, "failed": s.failed, "weighted_hit_ratio": s.weighted_hit_ratio,
            "recompute_burden": s.new_prefill_tokens, "cached_tokens": s.cached_tokens,
            "ttft_p50_ms": s.ttft_p50_ms, "ttft_p95_ms": s.ttft_p95_ms,
            "e2e_p50_ms": s.e2e_p50_ms, "e2e_p95_ms": s.e2e_p95_ms, "tpot_p50_ms": s.tpot_p50_ms,
        }  # fmt: skip
        out.update({f"{s.agent_id}.{k}": float(v) for k, v in values.items() if v is not None})
    return out
