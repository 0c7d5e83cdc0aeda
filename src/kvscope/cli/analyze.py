"""`kvscope analyze`: the research-question analyses of one or more runs, as tables."""

from pathlib import Path
from typing import Annotated

import typer

from kvscope.cli.common import console, friendly
from kvscope.cli.report import RUNS_DIR_OPTION, TRACKING_OPTION
from kvscope.errors import KvscopeError
from kvscope.mlflow_runs import resolve_run

RQS = (1, 2, 3, 4, 5, 6)
PER_RUN = {
    1: ("overview", "agents", "turns"),
    2: ("transitions", "predictability"),
    6: ("latency",),
}
CROSS_RUN = {3: "rq3", 4: "rq4", 5: "rq5"}


def split_args(args: list[str], rq: list[str]) -> tuple[list[str], list[int]]:
    """Runs and research questions: `--rq 1 2 6` leaves 2 and 6 among the arguments, so an
    argument that is a question number (and no directory) counts as one; `--rq 1,2` works too."""
    runs: list[str] = []
    numbers = [part for item in rq for part in item.split(",") if part.strip()]
    for arg in args:
        if arg.isdigit() and int(arg) in RQS and not Path(arg).exists():
            numbers.append(arg)
        else:
            runs.append(arg)
    try:
        chosen = sorted({int(n) for n in numbers})
    except ValueError:
        raise KvscopeError(f"--rq takes question numbers {RQS}, got {numbers}") from None
    if bad := [n for n in chosen if n not in RQS]:
        raise KvscopeError(f"no research question {bad[0]}: choose from {RQS}")
    if not runs:
        raise KvscopeError("name at least one run directory or MLflow run id")
    return runs, chosen


@friendly
def analyze(
    runs: Annotated[list[str], typer.Argument(help="Run directories or MLflow run ids.")],
    rq: Annotated[
        list[str],
        typer.Option(
            help="Research questions to show: --rq 1 2 6 (default: 1 2 6 for one run; "
            "3 4 5 for several)."
        ),
    ] = [],  # noqa: B006 (typer reads the default; it is never mutated)
    runs_dir: Annotated[Path, RUNS_DIR_OPTION] = Path("runs"),
    tracking_uri: Annotated[str | None, TRACKING_OPTION] = None,
) -> None:
    """Print the analyses of RQ1 (agents, turns), RQ2 (transitions, next-agent predictability),
    RQ6 (workflow time) and, across runs, RQ3 (layout), RQ4 (cache pressure) and RQ5 (sharing)."""
    from kvscope.report import run_sections
    from kvscope.report.compare_sections import cross_run_sections
    from kvscope.report.pages import analyze_runs
    from kvscope.report.routing_section import routing_section
    from kvscope.report.terminal import print_section

    refs, chosen = split_args(runs, rq)
    if not chosen:
        chosen = [1, 2, 6] if len(refs) == 1 else [3, 4, 5]
    if not console.is_terminal:
        console.width = max(console.width, 200)  # wide tables: a log file does not wrap
    data = analyze_runs([resolve_run(r, runs_dir, tracking_uri) for r in refs])
    for d in data:
        for n in (n for n in chosen if n in PER_RUN):
            for key in PER_RUN[n]:  # the section builders of run_sections, by name
                section = getattr(run_sections, key)(d)
                print_section(console, section, d.label if len(data) > 1 else "")
        if 2 in chosen:  # a deployment's run: which transitions routing cost (RQ2's causes)
            for section in routing_section(d):
                print_section(console, section, d.label if len(data) > 1 else "")
    if any(n in CROSS_RUN for n in chosen):
        cross = {s.key: s for s in cross_run_sections(data)}
        for n in (n for n in chosen if n in CROSS_RUN):
            print_section(console, cross[CROSS_RUN[n]])
