"""A token-id trace as Arrow (an IPC stream, as kvscope writes prompt_tokens.arrow, or an IPC
file) or Parquet (as datasets are often shipped), read by pyarrow a group of record batches at a
time: no text to parse.

Columns, by name: `token_ids` (a list of integers; required), `request_id` (string or integer;
`request_uuid`, the name kvscope's own stream uses, is read the same; absent: the row's number),
and optional `timestamp` and `end_timestamp` (ms), `output_length`, `agent`, `workflow`,
`previous_agent`, with the JSONL token-id trace's meaning (sim/inputs/sources.py); a null is an
absent value. Other columns are ignored. The ids are hashed into block keys a group at a time as
they are read (rows.Hasher), so only the keys stay in memory.

Refused, each as a KvscopeError naming the file and the first bad row (from 1): token_ids that
are not a list of integers (the schema), a row without token_ids, a null id, a negative id, a
negative output_length, a column of the wrong type. A stream cut short (a torn last batch) is
read up to its last whole batch, and said in the notes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvscope.errors import KvscopeError
from kvscope.records.arrays import flags, numbers
from kvscope.records.base import ArrowBatches, joined
from kvscope.records.formats import MAGIC_FILE, MAGIC_PARQUET, head
from kvscope.sim.inputs.rows import Columns, Hasher, Read, gathered
from kvscope.sim.trace import Trace

GROUP_BYTES = 8 << 20  # record batches joined up to about this many bytes before reading them
PART_BYTES = 2 << 20  # then read in slices of about this many
PARQUET_ROWS = 1024  # rows a Parquet batch is read in
COLUMNS = ("token_ids", "request_id", "request_uuid", "timestamp", "end_timestamp",
           "output_length", "agent", "workflow", "previous_agent")  # fmt: skip  # what is read


def read_arrow_tokens(path: Path, block_size: int) -> tuple[Trace, list[str]]:
    """An Arrow token-id trace (see the module doc) and notes about it."""
    notes: list[str] = []
    return gathered(path, block_size, arrow_reads(path, block_size, notes)), notes


def arrow_reads(path: Path, block_size: int, notes: list[str]) -> Iterator[Read]:
    """Its requests a group of batches at a time, in file order, prompts hashed into block
    keys; once read to the end, `notes` has what to say about it."""
    hasher, count, missing = Hasher(block_size), 0, 0
    first = head(path)
    batches = None if first.startswith((MAGIC_FILE, MAGIC_PARQUET)) else ArrowBatches(path)
    read = _parquet_batches if first.startswith(MAGIC_PARQUET) else _file_batches
    for group in joined(batches if batches is not None else read(path), GROUP_BYTES):
        for part in _parts(group):
            columns, flat, counts, absent = _read(path, part, count)
            missing += absent
            count += len(columns.ids)
            yield columns, *hasher.keys_of(flat, counts)
    if missing:
        notes.append(f"{missing} requests without output_length: replayed with 0")
    if batches is not None and batches.torn:
        notes.append(f"{path}: the stream's last batch is cut short: read up to the one before")


def _parts(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """The batch in slices of about PART_BYTES (zero-copy): what is made of a slice's ids (as
    int64, their keys) is held one slice at a time."""
    k = -(-batch.get_total_buffer_size() // PART_BYTES)
    step = max(-(-batch.num_rows // max(k, 1)), 1)
    for lo in range(0, batch.num_rows, step):
        yield batch.slice(lo, step)


def _parquet_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """A Parquet file's rows, a batch at a time (pyarrow.parquet; only where the trace is one)."""
    import pyarrow.parquet as pq

    try:
        reader = pq.ParquetFile(path, pre_buffer=False)  # pre-buffered: ~2.7x the memory
    except (OSError, pa.ArrowInvalid) as err:
        raise KvscopeError(f"{path}: not a readable Parquet file ({err})") from None
    names = [n for n in reader.schema_arrow.names if n in COLUMNS]  # not a dataset's text
    try:
        yield from reader.iter_batches(batch_size=PARQUET_ROWS, columns=names)
    except (OSError, pa.ArrowInvalid) as err:
        raise KvscopeError(f"{path}: Parquet data cannot be read on ({err})") from None


def _file_batches(path: Path) -> Iterator[pa.RecordBatch]:
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
    except (OSError, pa.ArrowInvalid) as err:
        raise KvscopeError(f"{path}: not a readable Arrow file ({err})") from None
    for k in range(reader.num_record_batches):
        yield reader.get_batch(k)


def _read(
    path: Path, batch: pa.RecordBatch, before: int
) -> tuple[Columns, np.ndarray, np.ndarray, int]:
    """One group's Columns, its ids flat, their count per request and how many lack an output
    length; `before`: the rows read before it."""
    names = batch.schema.names
    if "token_ids" not in names:
        raise KvscopeError(f"{path}: no token_ids column (columns: {', '.join(names)})")
    ids = batch.column("token_ids")
    kind = ids.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(
        kind.value_type
    ):
        raise KvscopeError(f"{path}: column 'token_ids' is {kind}, not a list of integers")
    if ids.null_count:
        _first_bad(path, flags(ids.is_null()), before, "has no token_ids")
    values = ids.flatten()
    counts = numbers(pc.list_value_length(ids)).astype(np.int64)
    if values.null_count:
        rows = np.repeat(np.arange(len(ids)), counts)[flags(values.is_null())]
        raise KvscopeError(f"{path}: row {before + int(rows[0]) + 1}: a null token id")
    flat = numbers(values)
    if flat.dtype.kind == "i" and len(flat) and flat.min() < 0:
        row = int(np.repeat(np.arange(len(ids)), counts)[np.argmax(flat < 0)])
        raise KvscopeError(f"{path}: row {before + row + 1}: a negative token id")
    n = len(ids)
    start = _floats(path, batch, "timestamp")
    start = np.where(np.isnan(start), before + np.arange(n, dtype=np.float64), start)
    end = _floats(path, batch, "end_timestamp")
    end = np.maximum(np.where(np.isnan(end), start, end), start)
    output = _floats(path, batch, "output_length", integer=True)
    absent = int(np.isnan(output).sum())
    output = np.nan_to_num(output).astype(np.int64)
    _first_bad(path, output < 0, before, "has a negative output_length")
    rid = "request_id" if "request_id" in names else "request_uuid"
    request_ids = (
        [str(v) for v in batch.column(rid).to_pylist()]
        if rid in names
        else [str(before + k + 1) for k in range(n)]
    )
    labels = {name: _labels(path, batch, name) for name in ("agent", "workflow", "previous_agent")}
    given = [False if v is None else v for v in labels["previous_agent"]]  # null: derived
    columns = Columns(
        request_ids, start, end, counts, output, labels["agent"], labels["workflow"], given
    )
    return columns, flat, counts, absent  # the column's own buffer: the hasher reads it


def _first_bad(path: Path, mask: np.ndarray, before: int, what: str) -> None:
    """Refuses the first row `mask` holds (numpy, not pyarrow: see records/arrays.py)."""
    bad = np.flatnonzero(mask)
    if len(bad):
        raise KvscopeError(f"{path}: row {before + int(bad[0]) + 1} {what}")


def _floats(path: Path, batch: pa.RecordBatch, name: str, integer: bool = False) -> np.ndarray:
    """Column `name` as float64 (NaN: null or absent); refused when not numeric."""
    if name not in batch.schema.names:
        return np.full(batch.num_rows, np.nan)
    col = batch.column(name)
    numeric = pa.types.is_integer(col.type) or (not integer and pa.types.is_floating(col.type))
    if not numeric and not pa.types.is_null(col.type):
        need = "integers" if integer else "numbers"
        raise KvscopeError(f"{path}: column {name!r} is {col.type}, not {need}")
    return numbers(col.cast(pa.float64()), fill=np.nan)


def _labels(path: Path, batch: pa.RecordBatch, name: str) -> list[str | None]:
    if name not in batch.schema.names:
        return [None] * batch.num_rows
    col = batch.column(name)
    kind = col.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
        raise KvscopeError(f"{path}: column {name!r} is {kind}, not strings")
    return col.to_pylist()
