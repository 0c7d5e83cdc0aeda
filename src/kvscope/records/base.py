"""What every stream shares: the JSONL and Arrow IPC appenders and readers, Arrow schemas from
dataclasses.

A stream is appended while the run goes, one record at a time, flushed at once: a crash loses
nothing that was written. A JSONL stream has one JSON line per record (read by people: requests,
tools, payloads); reading skips unreadable lines (a write cut short) and counts them. An Arrow
stream (token ids: records.tokens, records.kv_events) is an Arrow IPC stream file, its schema
message then one record batch message per record (ArrowWriter); reading (ArrowBatches) keeps every
complete batch and stops at a torn tail (a write cut short). It has no end-of-stream marker, so
that it stays appendable; reopening one for appending first cuts a torn tail off.
"""

import itertools
import json
import os
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, Union, get_args, get_origin

import orjson
import pyarrow as pa

from kvscope.errors import WriteError
from kvscope.records.formats import is_arrow_stream
from kvscope.records.plain import record_dict  # noqa: F401  (the records import it from here)

Row = dict[str, Any]  # one row of a table as a dict (a request, a block life, a sample)


class Record(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Record)
T = TypeVar("T")


class JsonlWriter(Generic[R]):
    """Appends one JSON line per record to `path` and flushes it; safe to call from threads.

    A record is a dataclass whose `to_dict` is its fields as a dict (asdict): orjson writes the
    line from the fields directly (UTF-8, no deep copy; ~20x cheaper than json over asdict for a
    request row); a value orjson cannot write (an int key wider than 64 bits...) goes through
    json over `to_dict`, as before."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self._file = path.open("ab")
        self._lock = threading.Lock()

    def append(self, record: R) -> None:
        """Write one line; a WriteError (naming the path) when the file system refuses it (a
        full disk: what was written before is kept, a torn last line is skipped on reading)."""
        line = json_line(record)
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


class ArrowWriter(Generic[R]):
    """Appends one Arrow IPC record batch per record (`convert` makes it) to the stream file
    `path`, written and flushed at once; safe to call from threads.

    A new or empty file gets the schema message first; an existing one must have `schema`, and
    a torn tail it has (a crash mid-write) is cut off first. `convert` runs before anything is
    written: its ValueError (a value the schema cannot hold) leaves the stream as it was."""

    def __init__(
        self, path: Path, schema: pa.Schema, convert: Callable[[R], pa.RecordBatch]
    ) -> None:
        self.path, self.schema, self._convert = path, schema, convert
        self.rows = 0
        self._lock = threading.Lock()
        try:
            end = _complete_end(path, schema) if path.exists() else 0
            self._file = path.open("r+b" if path.exists() else "wb")
            self._file.truncate(end)
            self._file.seek(end)
            if not end:
                self._write(schema.serialize())
        except OSError as err:
            raise WriteError(f"cannot write {path}: {err.strerror or err}") from err

    def append(self, record: R) -> None:
        """Write the record's batch; a WriteError (naming the path) when the file system refuses
        it (a full disk: what was written before is kept, a torn batch is left off on reading)."""
        self.append_batch(self._convert(record))

    def append_batch(self, batch: pa.RecordBatch) -> None:
        if not batch.schema.equals(self.schema):
            raise ValueError(f"a batch of another schema for {self.path}: {batch.schema}")
        message = batch.serialize()
        with self._lock:
            if self._file.closed:
                return  # a late record after close(): the stream is complete already
            self._write(message)
            self.rows += batch.num_rows

    def _write(self, data: pa.Buffer | bytes) -> None:
        try:
            self._file.write(data)
            self._file.flush()
        except OSError as err:
            why = err.strerror or str(err)
            msg = f"cannot write {self.path}: {why} (the rows before are kept)"
            raise WriteError(msg) from err

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> "ArrowWriter[R]":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _complete_end(path: Path, schema: pa.Schema) -> int:
    """Where the stream's last complete message ends (0: not even its schema is whole); a
    ValueError when it is a stream of another schema."""
    end = 0
    if path.stat().st_size and not is_arrow_stream(path):
        raise ValueError(f"{path} is not an Arrow IPC stream: not appended to")
    with pa.OSFile(str(path)) as f:
        reader = pa.ipc.MessageReader.open_stream(f)
        try:
            first = reader.read_next_message()
            if not pa.ipc.read_schema(first).equals(schema):
                raise ValueError(f"{path} is a stream of another schema")
            end = f.tell()
            while True:
                reader.read_next_message()
                end = f.tell()
        except (StopIteration, OSError, pa.ArrowInvalid):
            return end


CHUNK_BYTES = 8 << 20  # record batches a reader joins into one (ArrowBatches.chunks)


class ArrowBatches:
    """The complete record batches of an Arrow IPC stream file, in order, read as iterated
    (one batch at a time in memory); iteration stops at a torn tail (a write cut short) and then
    `torn` is 1. A file too short for a schema has no batches (torn if it is not empty)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.torn = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        with pa.OSFile(str(self.path)) as f:
            try:
                reader = pa.ipc.open_stream(f)
            except (OSError, pa.ArrowInvalid):
                self.torn = int(self.path.stat().st_size > 0)
                return
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                except (OSError, pa.ArrowInvalid):
                    self.torn = 1
                    return
                yield batch

    def chunks(self, nbytes: int = CHUNK_BYTES) -> Iterator[pa.RecordBatch]:
        """The batches joined into batches of about `nbytes` each (the last one smaller)."""
        return joined(self, nbytes)


def joined(
    batches: Iterable[pa.RecordBatch], nbytes: int = CHUNK_BYTES
) -> Iterator[pa.RecordBatch]:
    """Consecutive batches joined into batches of about `nbytes` each (the last one smaller)."""
    group: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        group.append(batch)
        size += batch.get_total_buffer_size()
        if size >= nbytes:
            yield group[0] if len(group) == 1 else pa.concat_batches(group)
            group, size = [], 0
    if group:
        yield group[0] if len(group) == 1 else pa.concat_batches(group)


def compact(path: Path, schema: pa.Schema, parts: Sequence[Path] = ()) -> bool:
    """Rewrite an Arrow stream file, with the batches of `parts` after its own (each then
    removed), as batches of about CHUNK_BYTES: a writer's one batch per record costs a reader
    ~10 us each (~1 s per 100k records), a joined one nothing. The new file replaces the stream
    atomically, before the parts are removed: a crash or a refused write leaves the stream as it
    was (a crash before the parts are removed: their records twice). Torn tails are left off.
    Whether it was rewritten."""
    tmp = path.with_name(f".{path.name}.compacting")
    try:
        with ArrowWriter[Any](tmp, schema, lambda b: b) as out:
            sources = [ArrowBatches(p) for p in [path] * path.exists() + list(parts)]
            for batch in joined(itertools.chain.from_iterable(sources)):
                out.append_batch(batch)
        os.replace(tmp, path)
    except (OSError, WriteError):
        tmp.unlink(missing_ok=True)
        return False
    for part in parts:
        part.unlink()
    return True


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


def json_line(record: Any) -> bytes:
    """One JSON line (newline included) of a dataclass record (see JsonlWriter)."""
    try:
        return orjson.dumps(record, option=_LINE)
    except TypeError:
        return (json.dumps(record.to_dict(), separators=(",", ":")) + "\n").encode()


_LINE = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS


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
