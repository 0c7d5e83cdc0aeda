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
from kvscope.finalize import divergence, routing_misses
from kvscope.records import requests
from kvscope.records.base import read_jsonl
from kvscope.records.prompt_columns import with_prompt_columns

Row = dict[str, Any]

READ = (
    "request_uuid", "start_ns", "end_ns", "status", "prompt_tokens", "cached_tokens",
    "workflow_run_id", "agent_id", "previous_agent_id", "turn_id", "thread_id",
)  # fmt: skip
EXPORTED = ("queue_ms", "prefill_ms", "decode_ms")  # the engine's own timings (engines.base)
SET = (
    "thread_turn", "replica", *EXPORTED, *divergence.COLUMNS, *context.COLUMNS,
    *requests.PROVENANCE_COLUMNS, *routing_misses.COLUMNS,
)  # fmt: skip
KEPT = READ + EXPORTED  # the exported timings are set only where the stream has none
_CHUNK = 8192  # full rows held at once while the table is built line by line


@dataclass(frozen=True)
class Stream:
    """requests.jsonl as finalize reads it."""

    packed: pa.Buffer  # every column (records.requests.ARROW_SCHEMA), one row per line read, as
    # a zstd-compressed Arrow IPC stream: held through finalize's peak (100k rows: 66 MiB -> 7)
    rows: list[Row]  # the same rows in the same order: KEPT, then SET as the passes set them
    skipped: int  # unreadable lines (a torn write)

    @property
    def table(self) -> pa.Table:
        """The full table, unpacked (~0.06 s at 100k rows)."""
        return pa.ipc.open_stream(self.packed).read_all()


def read(run_dir: Path) -> Stream:
    """The request stream as the full table and the working rows (see the module docstring)."""
    path = run_dir / requests.REQUESTS_JSONL
    skipped = 0
    try:
        table = pa_json.read_json(path, parse_options=_PARSE).cast(requests.ARROW_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        table, skipped = _line_by_line(path)
    table = with_prompt_columns(table, run_dir).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_PACK) as packer:
        packer.write_table(table)
    rows = _rows(table)
    del table
    return Stream(sink.getvalue(), rows, skipped)


_PARSE = pa_json.ParseOptions(
    explicit_schema=requests.ARROW_SCHEMA, unexpected_field_behavior="ignore"
)
_PACK = pa.ipc.IpcWriteOptions(compression="zstd")


def _line_by_line(path: Path) -> tuple[pa.Table, int]:
    """The table, one line at a time: unreadable lines are skipped and counted."""
    tables: list[pa.Table] = []
    full: list[Row] = []

    def keep(row: Row) -> None:
        full.append(row)
        if len(full) == _CHUNK:
            tables.append(requests.to_table(full))
            full.clear()

    skipped = read_jsonl(path, keep)[1]
    tables.append(requests.to_table(full))
    return pa.concat_tables(tables), skipped


def _rows(table: pa.Table) -> list[Row]:
    """The KEPT columns as a dict per row; a value repeated down a column is one object in all
    its rows (status, agent, workflow, counts: ~35 MiB less at 100k rows)."""
    columns = []
    for name in KEPT:
        column = table.column(name)
        distinct = pc.unique(column)
        if 2 * len(distinct) < len(column):
            values = distinct.to_pylist()
            at = pc.index_in(column, value_set=distinct).to_numpy(zero_copy_only=False)
            columns.append([values[i] for i in at.tolist()])
        else:
            columns.append(column.to_pylist())
    return [dict(zip(KEPT, values, strict=True)) for values in zip(*columns, strict=True)]


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
