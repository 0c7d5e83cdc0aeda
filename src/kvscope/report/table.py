"""The report's table model: what both the terminal (rich) and the HTML templates render.

A Section is one view of a run (or of several): a title, its figure as a data URI, its tables
with every cell already formatted, and its notes. Cells are text: a value that was not measured
is NULL ("—"), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # only annotated: a trace's replay report loads no pyarrow
    import pyarrow as pa

NULL = "—"  # shown for a value that was not measured
Kind = Literal["int", "ratio", "ms", "float", "text", "bool"]


@dataclass(frozen=True)
class Column:
    name: str  # the analysis table's column
    header: str
    kind: Kind = "int"


@dataclass(frozen=True)
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""
    text: list[bool] = field(default_factory=list)  # per column: left-aligned text


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    intro: str
    image: str | None = None  # data URI
    missing: str = ""  # the sentence shown instead of the image
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def fmt(value: Any, kind: Kind) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NULL
    if kind == "ratio":
        return f"{100 * value:.1f}%"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "ms":
        return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.1f}"
    if kind == "float":
        return f"{value:,.2f}"
    if kind == "bool":
        return "yes" if value else "no"
    return str(value)


def table(
    data: pa.Table, columns: Sequence[Column], title: str, note: str = "", drop_null: bool = False
) -> Table:
    """An analysis table for the page; with drop_null, columns null in every row are left out."""
    rows = data.to_pylist()
    cols = [c for c in columns if c.name in data.column_names]
    if drop_null:
        cols = [c for c in cols if c.kind == "text" or any(r[c.name] is not None for r in rows)]
    return Table(
        title,
        [c.header for c in cols],
        [[fmt(r[c.name], c.kind) for c in cols] for r in rows],
        note,
        [c.kind == "text" for c in cols],
    )


def facts(title: str, pairs: Sequence[tuple[str, str]]) -> Table:
    """A two-column table of labelled facts, without headers."""
    return Table(title, ["", ""], [[k, v] for k, v in pairs], text=[True, False])
