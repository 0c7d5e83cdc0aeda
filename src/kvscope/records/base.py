"""What every stream shares: one JSONL appender, one JSONL reader, Arrow schemas from dataclasses.

A stream is appended while the run goes, one JSON line per record, flushed at once: a crash loses
nothing that was written. Reading skips unreadable lines (a write cut short) and counts them.
"""

import json
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, Union, get_args, get_origin

import orjson
import pyarrow as pa

from kvscope.errors import WriteError


Row = dict[str, Any]  # one row of a table as a dict (a request, a block life, a sample)


class Record(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Record)
T = TypeVar("T")


class JsonlWriter(Generic[R]):
    """Appends one JSON line per record to `path` and flushes it; safe to call from threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def append(self, record: R) -> None:
        """Write one line; a WriteError (naming the path) when the file system refuses it (a
        full disk: what was written before is kept, a torn last line is skipped on reading)."""
        line = json.dumps(record.to_dict(), separators=(",", ":")) + "\n"
        with self._lock:
            if self._file.closed:
                return  # a late record after close(): the stream is complete already
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as err:
                why = err.strerror or str(err)
                msg = f"cannot write {self.path}: {why} (the rows before are kept)"
                raise WriteError(msg) from err
            self.rows += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> "JsonlWriter[R]":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_jsonl(
    path: Path, convert: Callable[[dict[str, Any]], T] | None = None
) -> tuple[list[T], int]:
    """The rows of a JSONL stream (each passed through `convert` as it is read, so only the
    converted rows are held), and how many unreadable lines (a torn write) were skipped.

    Lines are parsed by orjson, which gives every row the same key string objects (its key
    cache: a 100k-row request stream is ~220 MiB, not ~550); a line it refuses (NaN, an integer
    past 64 bits: Python's json writes both) is read by the json module."""
    rows: list[Any] = []
    bad = 0
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                parsed = orjson.loads(line)
            except orjson.JSONDecodeError:
                try:
                    parsed = json.loads(line)
                except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
                    bad += 1
                    continue
            rows.append(convert(parsed) if convert is not None else parsed)
    return rows, bad


def record_dict(record: Any) -> dict[str, Any]:
    """A dataclass record as plain JSON-ready values (tuples become lists)."""
    assert is_dataclass(record) and not isinstance(record, type)
    return _plain(asdict(record))


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The table with every column of `schema`: ones an older run lacks are added as nulls."""
    for field in schema:
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table


_ARROW = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def arrow_schema(cls: type, types_: Mapping[str, pa.DataType] | None = None) -> pa.Schema:
    """The Arrow schema of a flat dataclass: str/int/float/bool columns, nullable where the type
    admits None; `types_` overrides a column's Arrow type."""
    out = []
    for f in fields(cls):
        args = get_args(f.type) if get_origin(f.type) in (Union, types.UnionType) else ()
        base = next(a for a in args if a is not type(None)) if args else f.type
        arrow = (types_ or {}).get(f.name, _ARROW[base])
        out.append(pa.field(f.name, arrow, nullable=type(None) in args))
    return pa.schema(out)
