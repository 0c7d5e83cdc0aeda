"""What every `kvscope` command shares: consoles, one-line errors, progress lines."""

import functools
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from kvscope.errors import KvscopeError

# emoji=False: rich would turn a `file:100:` line number into an emoji (":100:" is one)
console = Console(emoji=False)
if not console.is_terminal and "COLUMNS" not in os.environ:
    console.width = 120  # logs and CI: tables stay readable instead of folding at 80
err_console = Console(stderr=True, emoji=False)

P = ParamSpec("P")
R = TypeVar("R")


def friendly(fn: Callable[P, R]) -> Callable[P, R]:
    """Report a KvscopeError as one `error:` line (plus an engine log tail) and exit 2; the
    message is printed as it is (no markup, no emoji: `x.jsonl:100:` stays intact)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except KvscopeError as err:
            err_console.print(
                f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(2) from None

    return wrapper


def command(app: typer.Typer, name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Register `fn` as command NAME of `app`, its KvscopeError shown as one line (friendly)."""

    def register(fn: Callable[P, R]) -> Callable[P, R]:
        wrapped = friendly(fn)
        app.command(name)(wrapped)
        return wrapped

    return register


class Progress:
    """Step lines on a terminal spinner; in CI (no TTY) one line per step, not per pip line."""

    def __init__(self) -> None:
        self._status = console.status("") if console.is_terminal else None
        self._last_step = ""

    def __enter__(self) -> "Progress":
        if self._status:
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status:
            self._status.__exit__(None, None, None)

    def __call__(self, message: str) -> None:
        step = message.split(":", 1)[0]
        if self._status:
            self._status.update(message)
        if step != self._last_step:
            console.print(f"  {step}", highlight=False)
            self._last_step = step
