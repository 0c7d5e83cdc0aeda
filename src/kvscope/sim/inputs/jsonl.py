"""The two JSONL trace formats (sim/inputs/sources.py describes them) read into a Trace.

The file is read a chunk of lines at a time (sim/inputs/chunks.py): a chunk's id lists (a
token-id line's `token_ids`, a Mooncake line's `hash_ids`) are read from the lines' bytes at
once (by compiled code or numpy), and its fields are checked a column at a time
(`_mooncake_whole`, `_tokens_whole`). A chunk where a check fails, or whose lists are in
another form, is read again line by line (`_mooncake_lines`, `_tokens_lines`), which refuses
the first bad line with its number, or reads lists the chunk's reader could not through
orjson, checked whole (dtype, minimum), never id by id in Python. A token-id trace's prompts
are hashed into block keys a chunk at a time while the file is read, so only the keys (one per
block) stay in memory, not the token ids.

What is refused, each as a KvscopeError naming the file, the line and the field: a line that is
not a JSON object; a missing field or one of the wrong type; a negative length; an id that is
not a non-negative integer (a fraction, a negative number, a string, true/false); a Mooncake
line whose hash_ids cannot be blocks of --block-size tokens: a prompt of `input_length` tokens
has ceil(input_length / block_size) blocks, the last partial one (a trace may leave its id
out), so fewer ids than full blocks or more ids than blocks is a block size other than the
trace's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.errors import KvscopeError
from kvscope.records import blockkey
from kvscope.records.blockkey import within
from kvscope.sim.inputs import chunks
from kvscope.sim.inputs.chunks import Chunk
from kvscope.sim.inputs.rows import Columns, Hasher, Read, gathered
from kvscope.sim.trace import LineNames, Trace, line_name


def field_of(
    path: Path, n: int, row: dict[str, Any], name: str, kind: type | tuple[type, ...]
) -> Any:
    if name not in row or row[name] is None:
        raise KvscopeError(f"{path}:{n}: missing field {name!r}")
    value = row[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise KvscopeError(f"{path}:{n}: field {name!r} has the wrong type ({value!r:.40})")
    return value


def length_of(path: Path, n: int, row: dict[str, Any], name: str) -> int:
    """A token count: an integer, at least 0."""
    value = int(field_of(path, n, row, name, int))
    if value < 0:
        raise KvscopeError(f"{path}:{n}: field {name!r} is negative ({value})")
    return value


def _ms(path: Path, n: int, row: dict[str, Any], name: str, default: float) -> float:
    if row.get(name) is None:
        return default
    return float(field_of(path, n, row, name, (int, float)))


def ids_of(path: Path, n: int, row: dict[str, Any], name: str, line: bytes) -> np.ndarray:
    """Field `name`, a list of integers from 0 to 2**64 - 1, as an int64 array (uint64 when an id
    is 2**63 or more), checked whole: the dtype numpy infers and the minimum. `line`: the raw
    line (numpy reads true as 1: a line with a true or false in it is checked id by id)."""
    if isinstance(row.get(name), np.ndarray):  # lifted by `lines`: checked already
        return row[name]
    values = field_of(path, n, row, name, list)
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.array(values)
    except (ValueError, OverflowError, TypeError):  # ragged lists
        return _checked(path, n, name, values)
    if arr.dtype.kind == "f" and arr.ndim == 1 and set(map(type, values)) == {int}:
        # ids beyond 2**63 (numpy infers float64, lossy): exact as uint64, checked whole
        try:
            return np.array(values, dtype=np.uint64)
        except OverflowError:  # negative or beyond 64 bits: _checked names the id
            return _checked(path, n, name, values)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or b"true" in line or b"false" in line:
        return _checked(path, n, name, values)
    if arr.dtype.kind == "i" and arr.min() < 0:
        return _checked(path, n, name, values)
    return arr


def _checked(path: Path, n: int, name: str, values: list[Any]) -> np.ndarray:
    """`values` as uint64, checked id by id: the KvscopeError for the first that is not an
    integer from 0 to 2**64 - 1."""
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
            raise KvscopeError(
                f"{path}:{n}: field {name!r} holds {_what(v)} ({v!r:.40} at position {k}): "
                "ids are integers from 0 to 2**64 - 1"
            )
    return np.array(values, dtype=np.uint64)


def _what(v: Any) -> str:
    """What a refused id is (orjson reads an integer beyond 64 bits as a float)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return "a negative id" if v < 0 else "an id beyond 64 bits"
    if isinstance(v, float):
        if not v.is_integer():
            return "a fractional id"
        if abs(v) >= 2.0**64:
            return "an id beyond 64 bits"
    return "a non-integer id"


def _block_size_check(path: Path, n: int, ids: int, length: int, block_size: int) -> None:
    """hash_ids must be the blocks of `length` tokens: between the full ones and all of them."""
    full, blocks = length // block_size, -(-length // block_size)
    if full <= ids <= blocks:
        return
    if ids and length:  # the block sizes whose ceil(length / size) is `ids`
        lo, hi = -(-length // ids), (-(-length // (ids - 1)) - 1 if ids > 1 else None)
        fits = f"{lo}" if hi == lo else f"{lo} to {hi}" if hi else f"{lo} or more"
        hint = f"; {ids} ids fit a block size of {fits}"
    else:
        hint = ""
    raise KvscopeError(
        f"{path}:{n}: field 'hash_ids' has {ids} ids, but input_length {length} is {blocks} "
        f"blocks of {block_size} tokens ({full} full){hint}: is --block-size right?"
    )


# --- Mooncake ------------------------------------------------------------------------------------


def read_mooncake(path: Path, block_size: int) -> Trace:
    """A Mooncake trace: `hash_ids` are the block keys (see the module doc)."""
    return gathered(path, block_size, mooncake_reads(path, block_size))


def mooncake_reads(path: Path, block_size: int) -> Iterator[Read]:
    """A Mooncake trace's requests a chunk at a time, in file order (`read_mooncake`'s)."""
    for chunk in chunks.read(path, "hash_ids", np.uint64):
        yield _mooncake_whole(chunk, block_size) or _mooncake_lines(path, chunk, block_size)


def _mooncake_whole(chunk: Chunk, block_size: int) -> Read | None:
    """The chunk's columns and keys checked a column at a time; None where a check fails."""
    rows, counts = chunk.rows, chunk.counts
    start = chunks.numbers_of(rows, "timestamp", (int, float), np.float64)
    length = chunks.numbers_of(rows, "input_length", (int,), np.int64)
    output = chunks.numbers_of(rows, "output_length", (int,), np.int64)
    end = chunks.numbers_of(rows, "end_timestamp", (int, float, type(None)), np.float64)
    if chunk.ids is None or counts is None or start is None or length is None:
        return None
    if output is None or end is None or min(length.min(), output.min()) < 0:
        return None
    full = length // block_size
    if ((counts < full) | (counts > -(-length // block_size))).any():
        return None
    keep = counts.copy() if (counts == full).all() else np.minimum(counts, full)
    flat = (
        chunk.ids if (keep == counts).all() else chunk.ids[within(counts) < np.repeat(keep, counts)]
    )
    ids: Sequence[str] = (
        [
            str(r["request_id"]) if "request_id" in r else line_name(n)
            for r, n in zip(rows, chunk.numbers, strict=True)
        ]
        if any("request_id" in r for r in rows)
        else LineNames(np.asarray(chunk.numbers))
    )
    return _columns(rows, ids, start, end, length, output), flat, keep


def _mooncake_lines(path: Path, chunk: Chunk, block_size: int) -> Read:
    """The chunk checked line by line: the first bad line's KvscopeError, else its Read."""
    ids, start, end, length, output, keys = [], [], [], [], [], []
    lifted = _lifted(chunk)
    for i, (n, row) in enumerate(zip(chunk.numbers, chunk.rows, strict=True)):
        start.append(float(field_of(path, n, row, "timestamp", (int, float))))
        end.append(_ms(path, n, row, "end_timestamp", math.nan))
        length.append(length_of(path, n, row, "input_length"))
        output.append(length_of(path, n, row, "output_length"))
        hash_ids = lifted[i]
        if hash_ids is None:
            hash_ids = ids_of(path, n, row, "hash_ids", chunk.lines[i])
        _block_size_check(path, n, len(hash_ids), length[-1], block_size)
        keys.append(hash_ids[: length[-1] // block_size].astype(np.uint64))
        ids.append(str(row["request_id"]) if "request_id" in row else line_name(n))
    counts = np.array([len(k) for k in keys], dtype=np.int64)
    flat = np.concatenate(keys) if keys else np.zeros(0, dtype=np.uint64)
    times = (np.array(v, dtype=np.float64) for v in (start, end))
    lengths = (np.array(v, dtype=np.int64) for v in (length, output))
    return _columns(chunk.rows, ids, *times, *lengths), flat, counts


def _lifted(chunk: Chunk) -> list[np.ndarray | None]:
    """Each row's lifted ids (None: the chunk's are not lifted)."""
    if chunk.ids is None or chunk.counts is None:
        return [None] * len(chunk)
    return np.split(chunk.ids, np.cumsum(chunk.counts)[:-1])


def _columns(
    rows: list[dict[str, Any]],
    ids: list[str],
    start: np.ndarray,
    end: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
) -> Columns:
    """A chunk's Columns; an end not given (NaN) or before the start is the start."""
    start = start.astype(np.float64, copy=False)
    end = np.maximum(np.where(np.isnan(end), start, end), start)
    return Columns(
        ids,
        start,
        end,
        prompt.astype(np.int64, copy=False),
        output.astype(np.int64, copy=False),
        [r.get("agent") for r in rows],
        [r.get("workflow") for r in rows],
        [r.get("previous_agent", False) for r in rows],
    )


# --- token ids -----------------------------------------------------------------------------------


def read_token_trace(path: Path, block_size: int) -> tuple[Trace, list[str]]:
    """A token-id trace: keys are chained from the token ids (see the module doc); and notes."""
    notes: list[str] = []
    return gathered(path, block_size, token_reads(path, block_size, notes)), notes


def token_reads(path: Path, block_size: int, notes: list[str]) -> Iterator[Read]:
    """A token-id trace's requests a chunk at a time, in file order, their prompts hashed into
    block keys; once read to the end, `notes` has what to say about it."""
    hasher, count, no_output = Hasher(block_size), 0, 0
    for chunk in chunks.read(path, "token_ids"):
        read = _tokens_whole(chunk, count) or _tokens_lines(path, chunk, count)
        columns, flat, counts, missing = read
        no_output += missing
        count += len(columns.ids)
        yield columns, *hasher.keys_of(flat, counts)
    if no_output:
        notes.append(f"{no_output} requests without output_length: replayed with 0")


def _tokens_whole(chunk: Chunk, before: int) -> tuple[Columns, np.ndarray, np.ndarray, int] | None:
    """The chunk checked a column at a time (`before`: requests in the chunks before it)."""
    rows = chunk.rows
    rids = chunks.column(rows, "request_id", (str, int))
    start = chunks.numbers_of(rows, "timestamp", (int, float, type(None)), np.float64)
    end = chunks.numbers_of(rows, "end_timestamp", (int, float, type(None)), np.float64)
    given = chunks.column(rows, "output_length", (int, type(None)))
    if chunk.ids is None or chunk.counts is None or rids is None or start is None:
        return None
    if end is None or given is None:
        return None
    output = np.array([0 if v is None else v for v in given], dtype=np.int64)
    if len(output) and output.min() < 0:
        return None
    start = np.where(np.isnan(start), before + np.arange(len(rows), dtype=np.float64), start)
    ids = [r if type(r) is str else str(r) for r in rids]
    columns = _columns(rows, ids, start, end, chunk.counts, output)
    return columns, chunk.ids, chunk.counts, given.count(None)


def _tokens_lines(
    path: Path, chunk: Chunk, before: int
) -> tuple[Columns, np.ndarray, np.ndarray, int]:
    """The chunk checked line by line: the first bad line's KvscopeError, else its columns."""
    ids, start, end, output, tokens = [], [], [], [], []
    missing, lifted = 0, _lifted(chunk)
    for i, (n, row) in enumerate(zip(chunk.numbers, chunk.rows, strict=True)):
        ids.append(str(field_of(path, n, row, "request_id", (str, int))))
        own = lifted[i]
        tokens.append(ids_of(path, n, row, "token_ids", chunk.lines[i]) if own is None else own)
        given = row.get("output_length") is not None
        missing += not given
        output.append(length_of(path, n, row, "output_length") if given else 0)
        start.append(_ms(path, n, row, "timestamp", float(before + i)))
        end.append(_ms(path, n, row, "end_timestamp", math.nan))
    counts = np.array([len(t) for t in tokens], dtype=np.int64)
    flat = blockkey.as_batches(tokens).concat(0, len(tokens))
    arrays = (np.array(v, dtype=float) for v in (start, end))
    columns = _columns(chunk.rows, ids, *arrays, counts, np.array(output, dtype=np.int64))
    return columns, flat, counts, missing
