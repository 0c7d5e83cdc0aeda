"""The `kvscope` command line."""

import signal
import sys

import typer

from kvscope.cli import analyze as analyze_commands
from kvscope.cli import engine
from kvscope.cli import log as log_command
from kvscope.cli import profile as profile_command
from kvscope.cli import replay as replay_command
from kvscope.cli import report as report_commands
from kvscope.cli import run as run_commands
from kvscope.cli import sweep as sweep_commands

app = typer.Typer(help=__doc__, no_args_is_help=True, pretty_exceptions_show_locals=False)
app.add_typer(engine.app, name="engine")
app.command("run")(run_commands.run)
# everything after the program's name is the program's: `kvscope profile python app.py --flag`
app.command(
    "profile",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)(profile_command.profile)
app.command("convert")(run_commands.convert)
app.command("ui")(run_commands.ui)
app.command("sweep")(sweep_commands.sweep)
app.command("report")(report_commands.report)
app.command("compare")(report_commands.compare)
app.command("analyze")(analyze_commands.analyze)
app.command("replay")(replay_command.replay)
app.command("log")(log_command.log)


def main() -> None:
    # SIGTERM unwinds like Ctrl-C, so that engines started in-process are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    app()
