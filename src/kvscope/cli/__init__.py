"""The `kvscope` command line."""

import signal
import sys

import typer

from kvscope.cli import engine

app = typer.Typer(help=__doc__, no_args_is_help=True, pretty_exceptions_show_locals=False)
app.add_typer(engine.app, name="engine")


def main() -> None:
    # SIGTERM unwinds like Ctrl-C, so that engines started in-process are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    app()
