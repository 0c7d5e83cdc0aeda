"""The report's sentences, from templates/prose.j2: `say("fit", fit)` renders its macro as one line.

Prose lives in the template; Python only picks the sentence and hands it the numbers.
"""

from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from kvscope.report.table import NULL, fmt


def sec(ms: float | None) -> str:
    """Milliseconds as seconds for a sentence ("12.3 s"); NULL when not measured."""
    return NULL if ms is None else f"{ms / 1000:,.1f} s"


@cache
def _macros() -> Any:
    env = Environment(
        loader=PackageLoader("kvscope.report", "templates"),
        autoescape=False,  # text: the HTML page escapes it where it is placed
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=StrictUndefined,
    )
    env.filters.update(fmt=fmt, sec=sec)
    env.globals["NULL"] = NULL
    return env.get_template("prose.j2").module


def say(name: str, *args: Any) -> str:
    """The sentence of macro `name`, its line breaks and indentation collapsed to single spaces."""
    return " ".join(str(getattr(_macros(), name)(*args)).split())
