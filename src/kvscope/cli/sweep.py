"""`kvscope sweep`: many runs from one base config and a matrix, then the compare report."""

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvscope.cli.common import console, friendly
from kvscope.sweep import (
    FAILED,
    OK,
    PointResult,
    Sweep,
    SweepHooks,
    SweepRecord,
    load_sweep,
    new_sweep_dir,
    preflight,
    run_sweep,
)
from kvscope.sweep.spec import short_value


@friendly
def sweep(
    config: Annotated[Path, typer.Argument(help="Sweep YAML: a base experiment and a matrix.")],
    runs_dir: Annotated[Path | None, typer.Option(help="Override the base's runs_dir.")] = None,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the points and engines; start nothing.")
    ] = False,
) -> None:
    """Run every point of a sweep (one run each, engines started once per engine config)."""
    plan = load_sweep(config, runs_dir=runs_dir, tracking_uri=tracking_uri)
    groups = plan.groups()
    console.print(
        f"[bold]{plan.name}[/]: {len(plan.points)} points, {len(groups)} engine "
        f"configuration(s) ({', '.join(str(len(g.points)) for g in groups)} points each)"
    )
    if dry_run:
        _show_plan(plan)
        return
    preflight(plan)
    from kvscope.capture import Hooks  # MLflow and LangGraph load slowly

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    out_dir = new_sweep_dir(plan)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stage]}"), TimeElapsedColumn())  # fmt: skip
    interrupted = False
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(plan.name, total=len(plan.points), stage="")

        def stage(text: str) -> None:
            bar.update(task, stage=text)

        hooks = SweepHooks(
            on_point=lambda p: bar.update(task, description=p.label),
            on_point_done=lambda r: bar.advance(task),
            on_stage=stage,
            run_hooks=Hooks(on_stage=stage),
        )
        try:
            record = run_sweep(plan, out_dir, hooks=hooks)
        except KeyboardInterrupt:
            interrupted = True
        bar.update(task, description=plan.name, stage="interrupted" if interrupted else "done")
    if interrupted:
        console.print(
            f"[red]interrupted[/]: the engine is stopped; what ran is in {out_dir / 'sweep.json'}"
        )
        raise typer.Exit(130)
    _show(record)
    console.print(f"run directories under {plan.runs_dir.resolve()}")
    _compare(record, out_dir)
    if failed := record.counts().get(FAILED, 0):  # the runs and the report are kept
        console.print(f"[red]{failed} of {len(record.points)} point(s) failed[/]")
        raise typer.Exit(1)


def _show_plan(plan: Sweep) -> None:
    table = Table(title="points", title_justify="left")
    for head in ("#", "run name", "engine"):
        table.add_column(head)
    where = {p.index: g.index for g in plan.groups() for p in g.points}
    for p in plan.points:
        table.add_row(str(p.index), p.label, str(where[p.index] + 1))
    console.print(table)


def _show(record: SweepRecord) -> None:
    """One row per point: its axis values, weighted hit ratio overall and per agent, time, error.

    Each axis is its own column (its key's last part), so the points differ on screen at any
    width; the run directories are listed by the sweep record, errors get a column when any.
    """
    if not console.is_terminal:  # a log file: room for every agent's column
        console.width = max(console.width, 200)
    table = Table(title=f"sweep {record.sweep}: weighted hit ratio", title_justify="left")
    axes = list(dict.fromkeys(k for p in record.points for k in p.overrides))
    agents = list(dict.fromkeys(a for p in record.points for a in p.agent_hit_ratio))  # as ran
    failed = any(p.status != OK for p in record.points)
    for axis in axes:
        table.add_column(axis.rsplit(".", 1)[-1], no_wrap=True)
    table.add_column("status", no_wrap=True)
    for head in ("all", *map(str, agents), "s"):
        table.add_column(head, justify="right")
    if failed:
        table.add_column("error")
    for p in record.points:
        table.add_row(
            *(short_value(p.overrides.get(axis, "")) for axis in axes),
            _status(p),
            _ratio(p.hit_ratio),
            *(_ratio(p.agent_hit_ratio.get(a)) for a in agents),
            "" if p.seconds is None else f"{p.seconds:.0f}",
            *([p.error or ""] if failed else []),
        )
    console.print(table)
    counts = ", ".join(f"{n} {status}" for status, n in record.counts().items())
    console.print(f"{counts}; sweep record: {record.path}")


def _status(p: PointResult) -> str:
    if p.status != OK:
        return f"[red]{p.status}[/]"
    return "ok" + (f" ({p.workflows_failed} wf failed)" if p.workflows_failed else "")


def _ratio(value: float | None) -> str:
    return "null" if value is None else f"{value:.1%}"


def _compare(record: SweepRecord, out_dir: Path) -> None:
    run_dirs = [Path(p.run_dir) for p in record.points if p.status == OK and p.run_dir]
    if not run_dirs:
        console.print("no point finished: no compare report")
        return
    from kvscope.report.pages import compare_report

    try:
        path = compare_report(run_dirs, out_dir / "compare.html")
    except Exception as err:  # the runs are kept either way
        console.print(f"[red]the compare report failed[/]: {type(err).__name__}: {err}")
        return
    record.compare_report = str(path)
    record.write()
    console.print(f"compare report: {path}")
