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

from kvscope import finalize
from kvscope.cli.common import console, friendly
from kvscope.config import ExperimentConfig, WorkloadConfig, load_yaml, parse_experiment
from kvscope.records.blocks import BLOCKS_PARQUET
from kvscope.records.requests import REQUESTS_PARQUET
from kvscope.records.run_dir import REPORT_ERROR, REPORT_HTML

if TYPE_CHECKING:
    from kvscope.publish import RunOutcome


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
    """Run the configured workflows (PEER, dynamic PEER, supervisor) on the engine and show, per
    agent, how the KV cache served them."""
    from kvscope.experiment import Hooks, run_experiment  # MLflow and LangGraph load slowly

    # MLflow sets its own INFO level when imported; its migration and flush lines would
    # break the progress display.
    logging.getLogger("mlflow").setLevel(logging.WARNING)

    cfg = load_experiment(config, workflows=workflows, concurrency=concurrency,
                          runs_dir=runs_dir, tracking_uri=tracking_uri)  # fmt: skip
    w = cfg.workload
    console.print(
        f"[bold]{cfg.name}[/]: {w.workflows} {_workflow_line(w)}, concurrency {w.concurrency}, "
        f"engine {cfg.engine.kind}"
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
    show(outcome, verdicts=w.loop != "fixed" or w.workflow != "peer")
    if outcome.error:  # the numbers do not cover the whole workload (summary.json's status)
        raise typer.Exit(1)


def _workflow_line(w: WorkloadConfig) -> str:
    """What the workflows are, in a few words."""
    if w.workflow == "supervisor":
        return f"supervisor workflows ({w.workers} workers, <= {w.max_steps} calls)"
    loop = {
        "fixed": f"{w.cycles} cycles",
        "model": f"Reviewer decides, <= {w.max_cycles}",
        "dynamic": f"Reviewer routes, <= {w.max_steps} calls",
    }[w.loop]
    return f"PEER workflows ({w.mode}, {w.layout}), {loop}"


def show(outcome: "RunOutcome", *, verdicts: bool) -> None:
    """The run's summary: the same analysis, tables and sentences as its report.html."""
    from kvscope.analysis.agents import as_table
    from kvscope.report.columns import COLUMNS
    from kvscope.report.prose import say
    from kvscope.report.run_sections import provenance_table
    from kvscope.report.table import table
    from kvscope.report.terminal import rich_table

    a, w = outcome.analysis, outcome.workload
    agents = table(as_table([*a.agents, a.total]), COLUMNS["agent"],
                   f"per agent ({outcome.benchmark_run_id})")  # fmt: skip
    console.print(rich_table(agents))
    failed = f" ({w.failed} ended by a failed call)" if w.failed else ""
    skipped = a.finalized.skipped_lines if a.finalized else 0
    torn = f"; {skipped} unreadable JSONL lines skipped" if skipped else ""
    invocations = len({r for r in a.requests["workflow_run_id"].to_pylist() if r is not None})
    workflows = w.workflows if w.workflows is not None else invocations
    console.print(f"{a.rows} LLM calls in {workflows} workflows{failed}{torn}")
    if w.unparsed_verdicts and verdicts:
        console.print(f"{w.unparsed_verdicts} routing decision(s) / verdict(s) could not be "
                      "parsed (model loop: treated as REVISE; dynamic: ended)")  # fmt: skip
    scrapes = [(f"{r.name} ", r.scrape, r.summary) for r in a.replicas]
    for who, sc, server in scrapes or [("", a.scrape, a.server)]:
        if sc is None:
            continue
        peak = server.get("kv_used_tokens_peak")
        console.print(
            f"{who}/metrics: {sc.scrapes} samples ({sc.samples_per_s:.1f}/s, {sc.errors} gaps)"
            + (f", KV used peak {peak:,.0f} tokens" if peak is not None else "")
        )
    if a.scrape_error:
        console.print(f"[red]/metrics: {a.scrape_error}[/]")
    if a.server_agents:
        view = Table(title="the engine's own per-agent view (metric label `agent`)",
                     title_justify="left")  # fmt: skip
        for i, head in enumerate(("agent", "prompt tokens", "cached tokens", "TTFT mean ms",
                                  "e2e mean ms")):  # fmt: skip
            view.add_column(head, justify="left" if i == 0 else "right")
        for agent, v in sorted(a.server_agents.items()):
            view.add_row(agent, _n(v.get("prompt_tokens")), _n(v.get("cached_tokens")),
                         _n(v.get("ttft_mean_ms")), _n(v.get("e2e_mean_ms")))  # fmt: skip
        console.print(view)
    _print_kv(outcome)
    _print_routing(outcome)
    if a.provenance:
        console.print("where each agent's prompt tokens came from (KV events):")
        console.print(rich_table(provenance_table(a)))
    if a.evictions is not None:
        if a.evictions.num_rows:
            console.print(rich_table(table(a.evictions, COLUMNS["eviction"],
                                           "evictions: evictor (inferred) -> victim")))  # fmt: skip
        else:
            console.print("evictions: none")
    if a.harm:
        worst = ", ".join(
            f"{h.transition} "
            + ("unknown" if h.recomputed_tokens is None else f"{h.recomputed_tokens:,}")
            for h in a.harm
        )
        console.print(f"recomputed tokens after harmful evictions, by transition: {worst}")
    for r in a.reconciliation:
        if r.exact:
            verdict = "[green]exact[/]"
        elif r.exact is None:
            verdict = "[dim]not checkable[/]"
        else:
            verdict = f"[red]differs by {r.difference:+,.0f}[/]"
        console.print(
            f"reconcile {r.replica + ' ' if r.replica else ''}{r.counter}: "
            f"{r.source.replace('_', ' ')} {_n(r.requests_sum)} vs engine "
            f"{_n(r.engine_delta)}: {verdict}"
            + (f" ({r.unmeasured_rows} rows unmeasured)" if r.unmeasured_rows else "")
        )
    for t in a.time_split:
        console.print(say("time_split", t), highlight=False)
    _print_where(outcome)


def _print_where(outcome: "RunOutcome") -> None:
    """The run's directory, report, MLflow run, traces and how to browse them."""
    run_dir = outcome.run_dir
    console.print(f"run directory: {run_dir}")
    if (run_dir / REPORT_HTML).exists():
        console.print(f"report: {run_dir / REPORT_HTML}")
    elif (run_dir / REPORT_ERROR).exists():
        error = (run_dir / REPORT_ERROR).read_text().strip()
        console.print(f"[red]report.html not written: {error}[/] (kvscope report RUN retries)")
    if outcome.mlflow_run_id:
        console.print(f"MLflow run: {outcome.mlflow_run_id} ({outcome.tracking_uri})")
    if outcome.mlflow_error:
        console.print(f"[yellow]MLflow: not logged ({outcome.mlflow_error})[/]; "
                      f"kvscope log {run_dir} uploads it", highlight=False)  # fmt: skip
    if outcome.audit is not None:
        au = outcome.audit
        color = "red" if au.dropped else "green"
        console.print(f"traces: [{color}]{au.written} written of {au.expected} workflows[/]"
                      + (f", {au.dropped} DROPPED" if au.dropped else ""))  # fmt: skip
    if outcome.error:
        console.print(f"[red]the run stopped early: {outcome.error}[/] (what was measured is kept)")
    uri = outcome.tracking_uri or ""
    if uri.startswith(("http://", "https://")):
        console.print(f"browse: {uri}")
    else:
        extra = "" if run_dir.parent.name == "runs" else f" --runs-dir {run_dir.parent}"
        console.print(f"browse: kvscope ui{extra}")


def _print_routing(outcome: "RunOutcome") -> None:
    """A deployment's run: per agent, where its calls went and what routing cost it."""
    from kvscope.analysis import replica_use

    rows = outcome.analysis.requests.to_pylist()
    if not any(r.get("replica") for r in rows):
        return  # one engine
    view = Table(title="routing (replicas behind the router)", title_justify="left")
    for i, head in enumerate(("agent", "calls", "on its top replica", "affinity",
                              "routing-miss tokens", "of prompt")):  # fmt: skip
        view.add_column(head, justify="left" if i == 0 else "right")
    misses = {m.group: m for m in replica_use.routing_by_agent(rows)}
    for aff in replica_use.affinity(rows):
        m = misses.get(aff.agent_id or "none")
        view.add_row(
            aff.agent_id or "none", str(aff.calls), f"{aff.top_calls} on {aff.top_replica}",
            _pct(aff.affinity), _n(m.routing_miss_tokens if m else None),
            _pct(m.routing_miss_share if m else None),
        )  # fmt: skip
    console.print(view)


def _pct(value: float | None) -> str:
    return "null" if value is None else f"{value:.1%}"


def _print_kv(outcome: "RunOutcome") -> None:
    kv = outcome.analysis.kv
    if kv is None:
        console.print("KV events: not recorded (the engine publishes none, or they are off)")
        return
    lost = f"[red]{kv.missing_batches} missing[/]" if kv.missing_batches else "0 missing"
    console.print(f"KV events: {kv.batches} batches, {kv.events} events, {lost}"
                  f" ({kv.recovered_batches} recovered from the replay socket)")  # fmt: skip
    for reason, n in kv.skipped.items():
        console.print(f"  provenance not computed for {n} request(s): {reason}")
    if kv.queue_unknown:
        console.print(f"  {kv.queue_unknown} request(s) without a queue time from the engine: "
                      "provenance placed them at their send time")  # fmt: skip


def _n(value: float | None) -> str:
    return "null" if value is None else f"{value:,.0f}"


@friendly
def convert(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Build a run's tables from its streams (e.g. of a crashed run): requests.parquet with
    the /metrics context and KV provenance columns, kv_events.parquet, blocks.parquet."""
    done = finalize.convert(run_dir)
    skipped = done.skipped_lines
    note = f" ({skipped} unreadable line(s) skipped: a write cut short)" if skipped else ""
    console.print(f"{done.rows} rows -> {run_dir / REQUESTS_PARQUET}{note}")
    console.print(f"/metrics context on {done.context_rows} rows"
                  + (f"; {done.blocks} KV blocks -> {BLOCKS_PARQUET}"
                     if done.kv else "; no KV events recorded"))  # fmt: skip


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
