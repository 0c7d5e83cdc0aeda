"""`kvscope run`, `convert` and `ui`: profile workflows, keep and browse the results."""

import contextlib
import logging
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvscope import finalize, store
from kvscope.analysis.agents import AgentSummary
from kvscope.cli.common import console, friendly
from kvscope.config import ExperimentConfig, load_yaml, parse_experiment

if TYPE_CHECKING:
    from kvscope.experiment import RunOutcome


def load_experiment(path: Path | None, **overrides: Any) -> ExperimentConfig:
    data = load_yaml(path) if path is not None else {}
    workload = dict(data.get("workload") or {})
    for key in ("workflows", "concurrency"):
        if overrides.get(key) is not None:
            workload[key] = overrides[key]
    if workload:
        data["workload"] = workload
    if overrides.get("runs_dir") is not None:
        data["runs_dir"] = str(overrides["runs_dir"])
    if overrides.get("tracking_uri") is not None:
        data["tracking"] = {
            **(data.get("tracking") or {}),
            "tracking_uri": overrides["tracking_uri"],
        }
    return parse_experiment(data, str(path) if path else "defaults")


@friendly
def run(
    config: Annotated[
        Path | None, typer.Argument(help="Experiment YAML; none = the demo on the embedded engine.")
    ] = None,
    workflows: Annotated[int | None, typer.Option(help="Override workload.workflows.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Override workload.concurrency.")] = None,
    runs_dir: Annotated[Path | None, typer.Option(help="Where run directories go.")] = None,
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI (default: SQLite under runs dir).")
    ] = None,
) -> None:
    """Run PEER workflows on the engine and show, per agent, how the KV cache served them."""
    from kvscope.experiment import Hooks, run_experiment  # MLflow and LangGraph load slowly

    # MLflow sets its own INFO level when imported; its migration and flush lines would
    # break the progress display.
    logging.getLogger("mlflow").setLevel(logging.WARNING)

    cfg = load_experiment(config, workflows=workflows, concurrency=concurrency,
                          runs_dir=runs_dir, tracking_uri=tracking_uri)  # fmt: skip
    w = cfg.workload
    console.print(
        f"[bold]{cfg.name}[/]: {w.workflows} PEER workflows ({w.mode}, {w.layout}), "
        f"concurrency {w.concurrency}, "
        + (f"{w.cycles} cycles" if w.loop == "fixed" else f"Reviewer decides, <= {w.max_cycles}")
        + f", engine {cfg.engine.kind}"
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[calls]} calls"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("starting", total=w.workflows, calls=0)
        calls = 0

        def on_call() -> None:
            nonlocal calls
            calls += 1
            bar.update(task, calls=calls)

        hooks = Hooks(
            on_stage=lambda stage: bar.update(task, description=stage),
            on_call=on_call,
            on_workflow_done=lambda: bar.advance(task),
        )
        outcome = run_experiment(cfg, hooks)
        bar.update(task, description="done")
    show(outcome, verdicts=w.loop == "model")


def show(outcome: "RunOutcome", *, verdicts: bool) -> None:
    table = Table(title=f"per agent ({outcome.benchmark_run_id})", title_justify="left")
    heads = ("agent", "calls", "prompt p50", "cached p50", "new prefill p50", "weighted hit",
             "recompute", "TTFT p50 ms", "TPOT p50 ms", "e2e p50 ms")  # fmt: skip
    for i, head in enumerate(heads):
        table.add_column(head, justify="left" if i == 0 else "right")
    for s in [*outcome.agents, outcome.total]:
        table.add_row(*_cells(s), style="bold" if s.agent_id == "all" else None)
    console.print(table)
    failed = sum(1 for w in outcome.workflows if not w.ok)
    console.print(
        f"{outcome.rows} LLM calls in {len(outcome.workflows)} workflows"
        + (f" ({failed} ended by a failed call)" if failed else "")
        + (
            f"; {outcome.skipped_lines} unreadable JSONL lines skipped"
            if outcome.skipped_lines
            else ""
        )
    )
    unparsed = sum(w.unparsed_verdicts for w in outcome.workflows)
    if unparsed and verdicts:
        console.print(f"{unparsed} Reviewer verdict(s) could not be parsed (treated as REVISE)")
    if outcome.scrape is not None:
        sc = outcome.scrape
        peak = outcome.server.get("kv_used_tokens_peak")
        console.print(
            f"/metrics: {sc.scrapes} samples ({sc.samples_per_s:.1f}/s, {sc.errors} gaps)"
            + (f", KV used peak {peak:,.0f} tokens" if peak is not None else "")
        )
    if outcome.scrape_error:
        console.print(f"[red]/metrics: {outcome.scrape_error}[/]")
    if outcome.server_agents:
        view = Table(title="the engine's own per-agent view (metric label `agent`)",
                     title_justify="left")  # fmt: skip
        for i, head in enumerate(("agent", "prompt tokens", "cached tokens", "TTFT mean ms",
                                  "e2e mean ms")):  # fmt: skip
            view.add_column(head, justify="left" if i == 0 else "right")
        for agent, v in sorted(outcome.server_agents.items()):
            view.add_row(agent, _n(v.get("prompt_tokens")), _n(v.get("cached_tokens")),
                         _n(v.get("ttft_mean_ms")), _n(v.get("e2e_mean_ms")))  # fmt: skip
        console.print(view)
    _print_kv(outcome)
    for r in outcome.reconciliation:
        if r.exact:
            verdict = "[green]exact[/]"
        elif r.exact is None:
            verdict = "[dim]not checkable[/]"
        else:
            verdict = f"[red]differs by {r.difference:+,.0f}[/]"
        console.print(
            f"reconcile {r.counter}: requests {_n(r.requests_sum)} vs engine "
            f"{_n(r.engine_delta)}: {verdict}"
            + (f" ({r.unmeasured_rows} rows unmeasured)" if r.unmeasured_rows else "")
        )
    _print_time_split(outcome)
    console.print(f"run directory: {outcome.run_dir}")
    if (outcome.run_dir / "report.html").exists():
        console.print(f"report: {outcome.run_dir / 'report.html'}")
    elif (outcome.run_dir / "report.error.txt").exists():
        error = (outcome.run_dir / "report.error.txt").read_text().strip()
        console.print(f"[red]report.html not written: {error}[/] (kvscope report RUN retries)")
    if outcome.mlflow_run_id:
        console.print(f"MLflow run: {outcome.mlflow_run_id} ({outcome.tracking_uri})")
    if outcome.audit is not None:
        a = outcome.audit
        color = "red" if a.dropped else "green"
        console.print(f"traces: [{color}]{a.written} written of {a.expected} workflows[/]"
                      + (f", {a.dropped} DROPPED" if a.dropped else ""))  # fmt: skip
    if outcome.error:
        console.print(f"[red]the run stopped early: {outcome.error}[/] (what was measured is kept)")
    uri = outcome.tracking_uri or ""
    if uri.startswith(("http://", "https://")):
        console.print(f"browse: {uri}")
    else:
        extra = (
            "" if outcome.run_dir.parent.name == "runs" else f" --runs-dir {outcome.run_dir.parent}"
        )
        console.print(f"browse: kvscope ui{extra}")


def _print_time_split(outcome: "RunOutcome") -> None:
    """Core = the engine core's queue + prefill (+ decode for the call); front end = the rest of
    the engine's own span (templating, tokenizing, hand-offs); client side = the client's rest."""
    for t in outcome.time_split:
        span = "TTFT" if t.span == "ttft" else "call time"
        if not t.matched:
            console.print(f"{span} split: not made (the engine counted {_n(t.engine_requests)}"
                          f" requests, the table has {t.rows})")  # fmt: skip
            continue
        console.print(
            f"{span} over {t.rows} calls: client {_s(t.client_ms)} = engine {_s(t.engine_ms)}"
            f" (core {_s(t.core_ms)} + front end {_s(t.front_end_ms)})"
            f" + client side {_s(t.client_side_ms)}"
        )


def _s(ms: float | None) -> str:
    return "null" if ms is None else f"{ms / 1000:,.1f} s"


def _print_kv(outcome: "RunOutcome") -> None:
    kv = outcome.kv
    if kv is None:
        console.print("KV events: not recorded (the engine publishes none, or they are off)")
        return
    lost = f"[red]{kv.missing_batches} missing[/]" if kv.missing_batches else "0 missing"
    console.print(f"KV events: {kv.batches} batches, {kv.events} events, {lost}"
                  f" ({kv.recovered_batches} recovered from the replay socket)")  # fmt: skip
    for reason, n in kv.skipped.items():
        console.print(f"  provenance not computed for {n} request(s): {reason}")
    if outcome.provenance:
        view = Table(title="where each agent's prompt tokens came from (KV events)",
                     title_justify="left")  # fmt: skip
        heads = ("agent", "cached: self", "cross-agent", "cross-workflow", "unattributed",
                 "uncached: evicted", "layout", "cold")  # fmt: skip
        for i, head in enumerate(heads):
            view.add_column(head, justify="left" if i == 0 else "right")
        for agent, v in outcome.provenance.items():
            view.add_row(agent, *(f"{n:,}" for n in v.values()))
        console.print(view)
    if not outcome.evictions:
        console.print("evictions: none")
        return
    view = Table(title="evictions: evictor (inferred) -> victim", title_justify="left")
    for i, head in enumerate(("evictor", "victim", "blocks", "same workflow", "harmful",
                              "recomputed tokens", "residency p50 ms")):  # fmt: skip
        view.add_column(head, justify="left" if i < 2 else "right")
    for c in outcome.evictions:
        view.add_row(c["evictor_agent_id"], c["victim_agent_id"], f"{c['evictions']:,}",
                     f"{c['same_workflow']:,}", f"{c['harmful']:,}",
                     _n(c["recomputed_tokens"]), _n(c["residency_ms_p50"]))  # fmt: skip
    console.print(view)
    if outcome.harm:
        worst = ", ".join(f"{h.transition} {h.recomputed_tokens:,}" for h in outcome.harm)
        console.print(f"recomputed tokens after harmful evictions, by transition: {worst}")


def _n(value: float | None) -> str:
    return "null" if value is None else f"{value:,.0f}"


def _cells(s: AgentSummary) -> list[str]:
    def num(v: float | None, fmt: str = ",.0f") -> str:
        return "null" if v is None else format(v, fmt)

    ratio = "null" if s.weighted_hit_ratio is None else f"{s.weighted_hit_ratio:.1%}"
    calls = f"{s.calls}" + (f" ({s.failed} failed)" if s.failed else "")
    return [s.agent_id, calls, num(s.prompt_tokens_p50), num(s.cached_tokens_p50),
            num(s.new_prefill_tokens_p50), ratio, num(s.new_prefill_tokens),
            num(s.ttft_p50_ms), num(s.tpot_p50_ms, ",.1f"), num(s.e2e_p50_ms)]  # fmt: skip


@friendly
def convert(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Build a run's tables from its streams (e.g. of a crashed run): requests.parquet with
    the /metrics context and KV provenance columns, kv_events.parquet, blocks.parquet."""
    tables = finalize.convert(run_dir)
    skipped = tables.skipped_lines
    note = f" ({skipped} unreadable line(s) skipped: a write cut short)" if skipped else ""
    context = sum(r.get("cache_used_tokens_before") is not None for r in tables.rows)
    console.print(f"{len(tables.rows)} rows -> {run_dir / store.REQUESTS_PARQUET}{note}")
    console.print(f"/metrics context on {context} rows"
                  + (f"; {len(tables.blocks)} KV blocks -> {finalize.BLOCKS_PARQUET}"
                     if tables.kv else "; no KV events recorded"))  # fmt: skip


@friendly
def ui(
    runs_dir: Annotated[Path, typer.Option(help="The runs directory of the local store.")] = Path(
        "runs"
    ),
    port: Annotated[int, typer.Option()] = 5000,
) -> None:
    """Open the MLflow UI on the local store (Ctrl-C to stop)."""
    from kvscope.probe.tracing import TrackingRun

    argv, env = TrackingRun.ui_command(runs_dir.resolve(), port)
    console.print(f"MLflow UI on http://127.0.0.1:{port} (store: {runs_dir.resolve()})")
    with contextlib.suppress(KeyboardInterrupt):
        subprocess.run(argv, env={**os.environ, **env}, check=False)
