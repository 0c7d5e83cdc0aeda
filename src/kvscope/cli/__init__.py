"""The `kvscope` command line.

Each command's module is imported only when the command runs (`main` builds the app with the
command asked for; help, or a name it does not know, builds them all), so `kvscope replay`
does not load what `kvscope run` needs. `app` is the whole app (tests, `python -m`)."""

import importlib
import signal
import sys
from typing import Any

import typer

# name -> (module, function, click context settings); "engine" is a group of commands
COMMANDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "engine": ("kvscope.cli.engine", "app", {}),
    "run": ("kvscope.cli.run", "run", {}),
    # everything after the program's name is the program's: `kvscope profile python app.py --flag`
    "profile": (
        "kvscope.cli.profile",
        "profile",
        {"allow_interspersed_args": False, "ignore_unknown_options": True},
    ),
    "convert": ("kvscope.cli.run", "convert", {}),
    "ui": ("kvscope.cli.run", "ui", {}),
    "sweep": ("kvscope.cli.sweep", "sweep", {}),
    "report": ("kvscope.cli.report", "report", {}),
    "compare": ("kvscope.cli.report", "compare", {}),
    "analyze": ("kvscope.cli.analyze", "analyze", {}),
    "replay": ("kvscope.cli.replay", "replay", {}),
    "log": ("kvscope.cli.log", "log", {}),
}


def build(names: list[str] | None = None) -> typer.Typer:
    """The app with the commands `names` (None: every command)."""
    app = typer.Typer(help=__doc__.splitlines()[0], no_args_is_help=True,
                      pretty_exceptions_show_locals=False)  # fmt: skip
    app.callback()(lambda: None)  # a group even with one command: `kvscope replay ...`
    for name in names or COMMANDS:
        module, attr, settings = COMMANDS[name]
        target = getattr(importlib.import_module(module), attr)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=name)
        else:
            app.command(name, context_settings=settings or None)(target)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return build()
    raise AttributeError(name)


def main() -> None:
    # SIGTERM unwinds like Ctrl-C, so that engines started in-process are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    asked = sys.argv[1] if len(sys.argv) > 1 else ""
    build([asked] if asked in COMMANDS else None)()
