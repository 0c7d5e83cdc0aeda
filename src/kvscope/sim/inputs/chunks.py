"""A JSONL trace read a chunk of lines at a time, its id lists parsed a chunk at once.

`read(path, lift, dtype)` yields `Chunk`s of about CHUNK_BYTES of whole lines. Each line is
parsed by orjson with the list of ids in field `lift` emptied; the chunk's lists, when every one
is plain decimal integers (digits, commas and spaces, as orjson and json.dumps write them), are
read at once into a flat array with a count per line, no Python int per id: by compiled code
(sim/inputs/list_kernel.py: the lists found in the chunk's bytes and read in one pass) where
numba is loaded already (a replay large enough to compile its pool) or the file is large enough
to pay for loading it, else by numpy (the lines split, their lists cut out, joined and read by
one `np.fromstring`); both give the same ids. A chunk where that does not hold (another form,
a line that is not JSON, a field that is not where it seemed) comes with `ids` None and each
line parsed whole (sim/inputs/jsonl.py `lines`, which refuses what is wrong with the line's
number): the readers check such a chunk line by line. Columns are taken from a chunk's objects
whole (`column`): a type check over the set of types, never a value at a time in Python. A
compressed file (gzip, bzip2, xz) is read through its decompressor, a chunk at a time
(records/formats.open_bytes); a UTF-8 byte order mark before the first line is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson

from kvscope.errors import KvscopeError
from kvscope.records import formats
from kvscope.sim.caches import compiled

CHUNK_BYTES = 1 << 20
# From this size on, lists are read by the compiled reader even where numba is not loaded yet:
# its ~0.5 s CPU of loading is then less than what np.fromstring's ~25 ns an id would cost more.
KERNEL_FROM_BYTES = 128 << 20
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some editors write first: skipped
_PLAIN = b"0123456789, "  # what a list read by np.fromstring may hold
_WATCH: ContextVar[Callable[[int], None] | None] = ContextVar("kvscope_read_watch", default=None)


@dataclass(frozen=True)
class Chunk:
    """Lines `numbers` (from 1; blank lines skipped) of a file and their objects `rows`.

    `ids`, `counts`: the lifted field's ids, flat, and how many each row has (then
    rows[i][lift] is []); None: not lifted, rows[i][lift] is as the line has it (an array where
    jsonl.lifted_ids read the line's own list). `lines`: each row's line, as bytes.
    """

    numbers: Sequence[int]
    lines: Sequence[bytes]
    rows: list[dict[str, Any]]
    ids: np.ndarray | None = None
    counts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)


class _Lines(Sequence[bytes]):
    """The lines of a chunk found by the compiled reader, cut from its text when asked for (a
    lifted chunk's rarely are)."""

    def __init__(self, text: bytes, spans: np.ndarray) -> None:
        self.text, self.spans = text, spans

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int) -> bytes:  # type: ignore[override]
        _, start, _, _, end = self.spans[i]
        return self.text[start:end]


@contextmanager
def watching(on_bytes: Callable[[int], None]) -> Iterator[None]:
    """Within it, `read` reports the bytes of each chunk it reads (a compressed file's text,
    decompressed) to `on_bytes`: how a progress bar follows a trace being read."""
    token = _WATCH.set(on_bytes)
    try:
        yield
    finally:
        _WATCH.reset(token)


def read(path: Path, lift: str, dtype: type = np.int64) -> Iterator[Chunk]:
    """The file's non-blank lines, a chunk at a time (see the module doc)."""
    kernel, key = kernel_for(path), b'"' + lift.encode() + b'"'
    first, carry, watch = 1, b"", _WATCH.get()
    with _opened(path) as f:
        while data := _read(f, path, first):
            if watch is not None:
                watch(len(data))
            if first == 1 and not carry:
                data = data.removeprefix(BOM)
            cut = data.rfind(b"\n") + 1  # after it: the start of a line the next read goes on with
            if not cut:
                carry += data
                continue
            text, carry = carry + data[:cut], data[cut:]
            chunk, lines = _chunk(path, first, text, key, lift, dtype, kernel)
            first += lines
            if chunk is not None:
                yield chunk
    if carry:
        chunk, _ = _chunk(path, first, carry + b"\n", key, lift, dtype, kernel)
        if chunk is not None:
            yield chunk


def kernel_for(path: Path) -> bool:
    """Whether `path`'s lists are read by the compiled reader (see the module doc)."""
    if compiled.loaded():
        return True
    try:
        return path.stat().st_size >= KERNEL_FROM_BYTES
    except OSError:  # _opened says why it cannot be read
        return False


def _chunk(
    path: Path, first: int, text: bytes, key: bytes, lift: str, dtype: type, kernel: bool
) -> tuple[Chunk | None, int]:
    """(the chunk of `text`'s lines, numbered from `first`; None where all are blank, the
    number of lines in `text`). `text`: whole lines, each ended by a newline."""
    if kernel and (found := _found(first, text, key, lift, dtype)):
        chunk, size = found
        return chunk if len(chunk) else None, size
    raw = text.split(b"\n")
    raw.pop()  # after the last newline: nothing
    kept = [i for i, line in enumerate(raw) if line.strip()]
    if len(kept) == len(raw):
        numbers: Sequence[int] = range(first, first + len(raw))
        lines = raw
    else:
        numbers, lines = [first + i for i in kept], [raw[i] for i in kept]
    if not lines:
        return None, len(raw)
    chunk = _lifted(numbers, lines, key, lift, dtype) or _whole(path, numbers, lines, lift, dtype)
    return chunk, len(raw)


def _found(first: int, text: bytes, key: bytes, lift: str, dtype: type) -> tuple[Chunk, int] | None:
    """(the chunk with its lists found and read by compiled code, the number of lines in
    `text`), or None where a line does not allow it."""
    from kvscope.sim.inputs.list_kernel import find_lists  # loads numba: only when used

    found = find_lists(text, key, dtype)
    if found is None:
        return None
    spans, ids, counts, size = found
    rows = _emptied_rows((text[s : o + 1] + text[c:e] for _, s, o, c, e in spans.tolist()), lift)
    if rows is None:
        return None
    numbers = range(first, first + size) if len(rows) == size else (spans[:, 0] + first).tolist()
    return Chunk(numbers, _Lines(text, spans), rows, ids, counts), size


def _lifted(
    numbers: Sequence[int], lines: list[bytes], key: bytes, lift: str, dtype: type
) -> Chunk | None:
    """The chunk with its lists read at once by numpy, or None where a line does not allow it."""
    cut = [_list_of(line, key) for line in lines]
    if None in cut:
        return None
    read = _ids([c[1] for c in cut], dtype)  # type: ignore[index]
    if read is None:
        return None
    rows = _emptied_rows((c[0] + c[2] for c in cut), lift)  # type: ignore[index]
    return None if rows is None else Chunk(numbers, lines, rows, *read)


def _emptied_rows(texts: Iterable[bytes], lift: str) -> list[dict[str, Any]] | None:
    """The objects of lines whose list was cut out (`"lift":[]` left), or None where one is not
    a JSON object whose field `lift` is now that empty list (the list was not the field's)."""
    try:
        rows = [orjson.loads(t) for t in texts]
    except orjson.JSONDecodeError:
        return None
    if any(type(r) is not dict or r.get(lift) != [] for r in rows):
        return None
    return rows


def _ids(texts: list[bytes], dtype: type) -> tuple[np.ndarray, np.ndarray] | None:
    """(the ids of the lists `texts` flat, how many each has), parsed by one np.fromstring; None
    where a list is not plain integers below dtype's maximum. Where every list holds something,
    they are read with an end mark after each (-1 signed, dtype's maximum unsigned: no list
    holds a '-', and an id at the maximum is refused anyway, so an id that is not a mark adds
    an end and fails the count): the ends give the counts. Otherwise each list's commas do."""
    if any(t.translate(None, _PLAIN) for t in texts):
        return None
    info = np.iinfo(dtype)
    end = -1 if info.min < 0 else info.max
    marked = all(t.strip() for t in texts)
    if marked:
        mark = b"," + str(end).encode()
        joined = (mark + b",").join(texts) + mark
    else:
        joined = b",".join([t for t in texts if t.strip()])
        joined += b",0" if joined else b""  # an end: a list that stops the parse falls short
    try:
        ids = np.fromstring(joined, dtype=dtype, sep=",") if joined else np.zeros(0, dtype)
    except ValueError:  # numpy >= 2.3 raises where older ones stop early
        return None
    if marked:
        ends = np.flatnonzero(ids == end)
        if len(ends) != len(texts) or (len(ends) and ends[-1] != len(ids) - 1):
            return None
        counts = np.diff(ends, prepend=-1) - 1
        ids = ids[ids != end]
    else:
        counts = np.array([t.count(b",") + 1 if t.strip() else 0 for t in texts], np.int64)
        if len(ids) != (int(counts.sum()) + 1 if joined else 0):
            return None
        ids = ids[: len(ids) - 1] if joined else ids
    if len(ids) and ids.max() == info.max:  # strtoll / strtoull saturate
        return None
    return ids, counts


def _list_of(line: bytes, key: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(the line up to the list's `[`, the list's text, from its `]` on) for the list that
    follows `key` (`"name"`, a colon, a `[`); None when there is none, or where `key` is
    in the line again (a nested object's field of that name, which the top-level check could
    not tell apart where the field's own list is empty)."""
    a = line.find(key)
    if a < 0:
        return None
    b = line.find(b"[", a)
    c = line.find(b"]", b)
    if b < 0 or c < 0 or line[a + len(key) : b].strip() != b":" or line.find(key, c) >= 0:
        return None
    return line[: b + 1], line[b + 1 : c], line[c:]


def _whole(path: Path, numbers: Sequence[int], lines: list[bytes], lift: str, dtype: type) -> Chunk:
    """The chunk parsed line by line (`parse_line`: refuses a line that is not JSON)."""
    key = b'"' + lift.encode() + b'":['
    rows = [
        parse_line(path, n, line, key, lift, dtype) for n, line in zip(numbers, lines, strict=True)
    ]
    return Chunk(numbers, lines, rows)


def _read(f: BinaryIO, path: Path, line: int) -> bytes:
    """The next CHUNK_BYTES of `f`; a file that cannot be read on (a torn or corrupt compressed
    file) is a KvscopeError saying from which line."""
    try:
        return f.read(CHUNK_BYTES)
    except formats.READ_ERRORS as err:
        raise KvscopeError(f"{path}: cannot be read on from line {line} ({err})") from None


def _opened(path: Path) -> BinaryIO:
    """The file's bytes, decompressed where it is compressed (records/formats.open_bytes)."""
    try:
        return formats.open_bytes(path)
    except ValueError as err:
        raise KvscopeError(f"{path} {err}") from None


def lines(path: Path) -> Iterator[tuple[int, dict[str, Any], bytes]]:
    """(line number from 1, object, the line) per non-blank line, each parsed whole."""
    n = 0
    with _opened(path) as f:
        try:
            for n, line in enumerate(f, 1):
                line = line.removeprefix(BOM) if n == 1 else line
                if line.strip():
                    yield n, parse_line(path, n, line), line
        except formats.READ_ERRORS as err:
            raise KvscopeError(f"{path}: cannot be read on from line {n + 1} ({err})") from None


def parse_line(
    path: Path,
    n: int,
    line: bytes,
    key: bytes | None = None,
    lift: str = "",
    dtype: type = np.int64,
) -> dict[str, Any]:
    """Line `n`'s object; a line that is not a JSON object fails. `key` (`"name":[`, the
    field `lift`): its list read by `lifted_ids` straight into an array of `dtype` where it can
    be (the object's `lift` is that array then), not as Python ints."""
    ids, rest = lifted_ids(line, key, dtype) if key else (None, line)
    try:
        row = orjson.loads(rest)
    except orjson.JSONDecodeError as err:
        raise KvscopeError(f"{path}:{n}: not JSON ({err.msg})") from None
    if not isinstance(row, dict):
        raise KvscopeError(f"{path}:{n}: not a JSON object")
    if ids is not None:
        if row.get(lift) != []:  # not where it seemed: read the whole line instead
            row = orjson.loads(line)
        else:
            row[lift] = ids
    return row


def lifted_ids(line: bytes, key: bytes, dtype: type = np.int64) -> tuple[np.ndarray | None, bytes]:
    """(the ids of the list that follows `key` (`"name":[`) as `dtype` (int64 or uint64), the
    line with the list emptied) when that list is compact decimal integers (digits between
    single commas) below dtype's maximum; else (None, line): the caller parses it whole (and
    refuses what is wrong). The field's name must be in the line once (see `_list_of`)."""
    a = line.find(key)
    name = key[: key.rindex(b'"') + 1]
    if a < 0 or line.find(name) < a:
        return None, line
    a += len(key)
    b = line.find(b"]", a)
    text = line[a:b]
    if b < 0 or text.translate(None, b"0123456789,") or line.find(name, b) >= 0:
        return None, line
    if not text:
        ids = np.zeros(0, dtype=dtype)
    elif b",," in text or text[:1] == b"," or text[-1:] == b",":
        return None, line
    else:
        ids = np.fromstring(text, dtype=dtype, sep=",")  # C strtoll/strtoull: saturates
        if len(ids) != text.count(b",") + 1 or (len(ids) and ids.max() == np.iinfo(dtype).max):
            return None, line
    return ids, line[:a] + line[b:]


def column(rows: list[dict[str, Any]], name: str, kinds: tuple[type, ...]) -> list[Any] | None:
    """Every row's `name` when each is of one of `kinds` (exactly: a bool is not an int; None
    where `kinds` holds type(None)); else None (the caller checks the rows one by one)."""
    values = [r.get(name) for r in rows]
    return values if set(map(type, values)) <= set(kinds) else None


def numbers_of(
    rows: list[dict[str, Any]], name: str, kinds: tuple[type, ...], dtype: type
) -> np.ndarray | None:
    """`column` as an array of `dtype`; None where a value is not of `kinds` or does not fit."""
    values = column(rows, name, kinds)
    if values is None:
        return None
    try:
        return np.array(values, dtype=dtype)
    except (OverflowError, TypeError, ValueError):
        return None
