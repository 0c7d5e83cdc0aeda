"""The request rows finalize works on: only the columns it reads or sets, beside the full table.

A run's request rows have ~70 columns, of which finalize reads a dozen and sets about thirty;
as dicts with every column, a 100k-call run's rows were ~360 MiB held through its peak. So the
stream is read once into the typed request table (all columns, records.requests.ARROW_SCHEMA;
by pyarrow's JSON reader, or line by line where it refuses the stream: a torn last line, a
value of another type) and into working rows holding only KEPT; finalize's passes set their
columns (SET) on the working rows, and `table_with` puts them back into the table, row by row.

Contract for finalize's passes: a working row holds the KEPT columns (None where the stream had
none) and the SET columns the passes have set so far. A pass that reads another column adds it
to READ; one that sets a column adds it to SET.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import json as pa_json

from kvscope.collect import context
from kvscope.finalize import divergence, heaptrim, routing
from kvscope.records import requests
from kvscope.records.base import read_jsonl

Row = dict[str, Any]

READ = (
    "request_uuid", "start_ns", "end_ns", "status", "prompt_tokens", "cached_tokens",
    "workflow_run_id", "agent_id", "previous_agent_id", "turn_id", "thread_id",
)  # fmt: skip
EXPORTED = ("queue_ms", "prefill_ms", "decode_ms")  # the engine's own timings (engines.base)
SET = (
    "thread_turn", "replica", *EXPORTED, *divergence.COLUMNS, *context.COLUMNS,
    *requests.PROVENANCE_COLUMNS, *routing.COLUMNS,
)  # fmt: skip
KEPT = READ + EXPORTED  # the exported timings are set only where the stream has none
_CHUNK = 8192  # full rows held at once while the table is built line by line


@dataclass(frozen=True)
class Stream:
    """requests.jsonl as finalize reads it."""

    table: pa.Table  # every column (records.requests.ARROW_SCHEMA), one row per line read
    rows: list[Row]  # the same rows in the same order: KEPT, then SET as the passes set them
    skipped: int  # unreadable lines (a torn write)


def read(run_dir: Path) -> Stream:
    """The request stream as the full table and the working rows (see the module docstring)."""
    path = run_dir / requests.REQUESTS_JSONL
    try:
        table = pa_json.read_json(path, parse_options=_PARSE).cast(requests.ARROW_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return _line_by_line(path)
    table = table.combine_chunks()
    heaptrim.release()  # the reader's blocks (finalize reads with Arrow on the C heap)
    return Stream(table, table.select(list(KEPT)).to_pylist(), 0)


_PARSE = pa_json.ParseOptions(
    explicit_schema=requests.ARROW_SCHEMA, unexpected_field_behavior="ignore"
)


def _line_by_line(path: Path) -> Stream:
    """read(), one line at a time: unreadable lines are skipped and counted."""
    tables: list[pa.Table] = []
    full: list[Row] = []

    def working(row: Row) -> Row:
        full.append(row)
        if len(full) == _CHUNK:
            tables.append(requests.to_table(full))
            full.clear()
        return {k: row.get(k) for k in KEPT}

    rows, skipped = read_jsonl(path, working)
    tables.append(requests.to_table(full))
    return Stream(pa.concat_tables(tables).combine_chunks(), rows, skipped)


def table_with(table: pa.Table, rows: Sequence[Row]) -> pa.Table:
    """The table with the SET columns the working rows hold (`rows`: in the table's order): a
    row's value where it has the column, the stream's where no pass set it."""
    if len(rows) != table.num_rows:
        raise ValueError(f"{len(rows)} working rows for a table of {table.num_rows}")
    for name in SET:
        present = [name in r for r in rows]
        if not any(present):
            continue
        at = table.schema.get_field_index(name)
        field = table.schema.field(at)
        values = pa.array([r.get(name) for r in rows], type=field.type)
        if not all(present):
            values = pc.if_else(pa.array(present), values, table.column(at))
        table = table.set_column(at, field, values)
    return table
