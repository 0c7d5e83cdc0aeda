"""`kvscope profile [--engine CONFIG | --attach URL] -- python app.py ARGS`: profile a program.

The program runs as a child process with the engine in the OpenAI SDK's own variables
(OPENAI_BASE_URL, OPENAI_API_KEY) and KVSCOPE_MODEL, and kvscope's probe loaded into every Python
interpreter it starts (probe/child.py). Its stdout, stderr and exit code are its own; kvscope's
progress and summary go to stderr, after the program's output. Ctrl-C reaches the program (it
shares the terminal's process group); kvscope waits for it to end, then keeps what was measured.
"""

import logging
from pathlib import Path
from typing import Annotated

import typer

from kvscope.cli.common import err_console, friendly
from kvscope.errors import ConfigError


@friendly
def profile(
    command: Annotated[
        list[str], typer.Argument(help="The program and its arguments, after `--`.")
    ],
    engine: Annotated[
        Path | None,
        typer.Option(help="Engine YAML (an engine section, or a whole experiment config)."),
    ] = None,
    attach: Annotated[
        str | None, typer.Option(help="Base URL of a running OpenAI-compatible engine.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Run name (default: the script's).")] = None,
    runs_dir: Annotated[Path | None, typer.Option(help="Where run directories go.")] = None,
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI (default: SQLite under runs dir).")
    ] = None,
    keep_cache: Annotated[
        bool, typer.Option(help="Do not empty the engine's prefix cache first.")
    ] = False,
    store_prompts: Annotated[
        bool, typer.Option(help="Keep each call's messages and serialized prompt text.")
    ] = False,
    eviction_hints: Annotated[
        str | None,
        typer.Option(
            help="Set each call's engine priority from the workflow (SGLang, with its "
            "`priority` eviction policy): none, steps-to-execution or predicted-next."
        ),
    ] = None,
) -> None:
    """Profile an unmodified program's model calls: per agent, per transition, with provenance."""
    from kvscope.capture import Hooks  # MLflow and LangGraph load slowly
    from kvscope.cli.run import show
    from kvscope.probe.child import attached_processes
    from kvscope.profiling import profile_config, profile_program

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    if not command:
        raise ConfigError("give the program to run after `--`: kvscope profile -- python app.py")
    cfg = profile_config(
        name or _default_name(command), engine, attach, command=tuple(command),
        runs_dir=runs_dir, tracking_uri=tracking_uri, cold_start=False if keep_cache else None,
        store_prompts=store_prompts, eviction_hints=eviction_hints,  # type: ignore[typeddict-item]
    )  # fmt: skip
    stage = lambda text: err_console.print(f"[dim]kvscope: {text}[/]", highlight=False)  # noqa: E731
    ran = profile_program(cfg, command, Hooks(on_stage=stage))
    analysis = ran.outcome.analysis
    _explain_empty(analysis.rows, attached_processes(analysis.run_dir), ran.base_url, command)
    with _to_stderr():
        show(ran.outcome, verdicts=False)
    raise typer.Exit(ran.code)


def _explain_empty(
    rows: int, processes: list[dict[str, object]], base_url: str | None, command: list[str]
) -> None:
    if rows:
        return
    if not processes:
        why = ("no Python process of it loaded kvscope's probe (a Python older than 3.10, a "
               "program that is not Python, or the reason it printed above)")  # fmt: skip
        if flags := isolating_flags(command):
            why = (f"Python's {' '.join(flags)} keeps it from reading PYTHONPATH's "
                   "sitecustomize, which loads the probe: drop the flag, or use "
                   "`with kvscope.profile(...)` inside the program")  # fmt: skip
        err_console.print(f"[yellow]kvscope: the probe did not load in the program[/]: {why}")
    else:
        err_console.print(
            f"[yellow]kvscope: the program made no calls to the engine at {base_url}[/] (it "
            "should take the engine from OPENAI_BASE_URL and the model from KVSCOPE_MODEL)"
        )


def isolating_flags(command: list[str]) -> list[str]:
    """The interpreter options in `command` (python -I, -S, -E, also combined as -IS) that stop
    Python from loading the probe's sitecustomize; [] for anything else."""
    if not command or not Path(command[0]).name.startswith("python"):
        return []
    found = []
    for arg in command[1:]:
        if not arg.startswith("-") or arg.startswith("--") or arg in ("-m", "-c"):
            break  # the script, a module or code: Python's own options are over
        found += [f"-{c}" for c in arg[1:] if c in "ISE"]
    return found


def _default_name(command: list[str]) -> str:
    """The script's name: `python examples/peer.py` -> peer; `app` otherwise."""
    for arg in command[1:] if Path(command[0]).name.startswith("python") else command:
        if arg.endswith(".py"):
            return Path(arg).stem.replace("_", "-") or "app"
    if len(command) > 2 and command[1] == "-m":
        return command[2].rsplit(".", 1)[-1]
    return Path(command[0]).name or "app"


class _to_stderr:
    """Print the shared console's output to stderr for a while (the program owns stdout)."""

    def __enter__(self) -> None:
        from kvscope.cli.common import console

        self._file = console.file
        console.file = err_console.file

    def __exit__(self, *_: object) -> None:
        from kvscope.cli.common import console

        console.file = self._file
