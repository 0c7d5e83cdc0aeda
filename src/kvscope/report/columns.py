"""The columns of the report's tables (columns.yaml): analysis column, header, how it shows.

`COLUMNS["agent"]` is the per-agent table's columns, in order; every table the report, the
terminal summary and `kvscope analyze` draw takes its columns from here.
"""

from functools import cache
from importlib.resources import files
from typing import Any

import yaml

from kvscope.analysis.latency import COMPONENTS
from kvscope.records.requests import PROVENANCE_COLUMNS
from kvscope.report.table import Column


@cache
def _spec() -> dict[str, Any]:
    return yaml.safe_load(files("kvscope.report").joinpath("columns.yaml").read_text())


def _column(item: str | dict[str, str]) -> Column:
    name, header = next(iter(item.items())) if isinstance(item, dict) else (item, None)
    default, *kind = _spec()["headers"][name]
    return Column(name, header or default, kind[0] if kind else "int")


def _table(name: str) -> tuple[Column, ...]:
    if name == "provenance":  # the request table's Level 3 columns, named after themselves
        return tuple(Column(c, c.removesuffix("_tokens").replace("_", " ")) for c in
                     PROVENANCE_COLUMNS)  # fmt: skip
    out: list[Column] = []
    for item in _spec()["tables"][name]:
        if isinstance(item, str) and item.startswith("..."):
            out.extend(_table(item.removeprefix("...")))
        else:
            out.append(_column(item))
    return tuple(out)


COLUMNS: dict[str, tuple[Column, ...]] = {name: _table(name) for name in _spec()["tables"]}
assert [c.name for c in COLUMNS["components"]] == list(COMPONENTS), "columns.yaml vs latency"
