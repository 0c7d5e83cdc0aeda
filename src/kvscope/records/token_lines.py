"""Reading the prompt-token stream (prompt_tokens.jsonl) fast: records.tokens.load_tokens.

A 100k-call run's stream is ~800 MB of JSON (~120 M token ids); a JSON parser per line, or
pyarrow's, takes seconds. The stream is read in chunks at line boundaries; in each chunk a line
exactly of the shape kvscope writes (`{"request_uuid":"u","token_ids":[1,2]}`, records.base's
JsonlWriter) or of json.dumps's default one (`{"request_uuid": "u", "token_ids": [1, 2]}`) gives
its request_uuid and the text of its id list by bytes operations, and the ids of all such lines
are parsed at once by numpy (`np.fromstring`, which lets other threads run: chunks are parsed on
worker threads while the next is split). What the fast path takes is checked; a line of any
other shape is parsed by `json.loads` (the exact path), and a chunk whose ids do not check out
is parsed that way whole. Memory: the result, plus a few chunks in flight.
"""

import json
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np

CHUNK_BYTES = 8 << 20  # bigger: a little faster, more memory in flight (4 chunks)
_TAIL = b"]}"
_DIGITS = b"0123456789"
_INT64_MAX = int(np.iinfo(np.int64).max)  # np.fromstring saturates an overflowing id to it


@dataclass(frozen=True)
class _Shape:
    """A line's bytes around its uuid and its ids: head, uuid, mid, ids (sep between), _TAIL."""

    head: bytes
    mid: bytes
    sep: bytes


_SHAPES = (
    _Shape(b'{"request_uuid":"', b'","token_ids":[', b","),  # records.base.JsonlWriter's
    _Shape(b'{"request_uuid": "', b'", "token_ids": [', b", "),  # json.dumps's default
)


def narrowest_dtype(lo: int, hi: int) -> np.dtype:
    """The smallest integer dtype holding every value in [lo, hi]: uint16, int32 or int64."""
    if lo >= 0 and hi < 1 << 16:
        return np.dtype(np.uint16)
    if lo >= -(1 << 31) and hi < 1 << 31:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


@dataclass
class _Ids:
    """An integer array with its least and greatest value (0, 0 when it is empty)."""

    values: np.ndarray
    lo: int
    hi: int

    @classmethod
    def of(cls, values: np.ndarray) -> "_Ids":
        if not len(values):
            return cls(values, 0, 0)
        lo, hi = int(values.min()), int(values.max())
        return cls(values.astype(narrowest_dtype(lo, hi)), lo, hi)


# A line, in order: its request_uuid and its ids' slice of its chunk's flat ids (the fast path),
# or its ids (the exact path).
_Entry = tuple[str, slice | _Ids]


@dataclass
class _Chunk:
    """One chunk's lines split: the fast lines' id lists (`pieces`, `count` ids in all), all of
    one shape (that of the first; a line of another takes the exact path)."""

    data: bytes
    stop: int  # the chunk's lines are data[:stop]
    shape: _Shape | None = None
    entries: list[_Entry] = field(default_factory=list)
    pieces: list[memoryview] = field(default_factory=list)
    count: int = 0


class Sink(Protocol):
    """Where read_lines puts the stream's lines, a chunk at a time, in the file's order."""

    def chunk(self, ids: np.ndarray | None, lines: list[tuple[str, slice | np.ndarray]]) -> None:
        """One chunk's lines in order: each's request_uuid and its ids, a slice of `ids` (the
        chunk's fast lines' ids end to end) or an array of its own, each array in the narrowest
        dtype holding its ids (narrowest_dtype)."""


def read_token_ids(path: Path, chunk_bytes: int = CHUNK_BYTES) -> dict[str, np.ndarray]:
    """request_uuid -> its prompt token ids, as arrays of one dtype: the narrowest holding every
    id of the stream (narrowest_dtype). Read as records.tokens.load_tokens states: a line that is
    not a JSON object with a string request_uuid and a list of integer token_ids is skipped,
    one whose token_ids is null is ignored, and a request_uuid written twice keeps its last line.
    """
    store = _Store()
    read_lines(path, store, chunk_bytes)
    return store.result()


def read_lines(path: Path, sink: Sink, chunk_bytes: int = CHUNK_BYTES) -> None:
    """The stream's lines into `sink`, read as read_token_ids states (a later line of a
    request_uuid comes later: the sink keeps the last)."""
    workers = max(1, min(2, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool, path.open("rb") as f:
        pending: deque[tuple[_Chunk, Future[_Ids | None]]] = deque()
        for data, stop in _blocks(f, chunk_bytes):
            c = _split(data, stop)
            pending.append((c, pool.submit(_parsed, *_joined(c))))
            if len(pending) > workers:  # a chunk for each worker while this one is split
                _finished(*pending.popleft(), sink)
        while pending:
            _finished(*pending.popleft(), sink)


def _blocks(f: BinaryIO, size: int) -> Iterator[tuple[bytes, int]]:
    """(data, stop): the file in blocks of about `size` bytes, data[:stop] ending at a line's end
    (or the file's); the rest of data begins the next block."""
    tail = b""
    while block := f.read(size):
        data = tail + block if tail else block
        stop = data.rfind(b"\n") + 1
        tail = data[stop:]
        if stop:
            yield data, stop
    if tail:
        yield tail, len(tail)


def _split(data: bytes, stop: int) -> _Chunk:
    """The chunk's lines: each of a fast shape as its uuid and its ids' place in the joined
    text (counted by its commas; checked when parsed), any other by json.loads."""
    c = _Chunk(data, stop)
    view = memoryview(data)
    pos = 0
    while pos < stop:
        end = data.find(b"\n", pos, stop)
        end = stop if end < 0 else end
        shape = c.shape or next((s for s in _SHAPES if data.startswith(s.head, pos, end)), None)
        uuid, a, b = None, 0, 0
        if shape and data.startswith(shape.head, pos, end) and data.endswith(_TAIL, pos, end):
            mid = data.find(shape.mid, pos + len(shape.head), end)
            a, b = mid + len(shape.mid), end - len(_TAIL)
            if mid >= 0 and a <= b:
                uuid = _plain_uuid(data[pos + len(shape.head) : mid])
        if uuid is None:
            if (entry := _exact(data[pos:end])) is not None:
                c.entries.append(entry)
        else:
            c.shape = shape
            n = data.count(b",", a, b) + 1 if a < b else 0
            c.entries.append((uuid, slice(c.count, c.count + n)))
            c.count += n
            if n:
                c.pieces.append(view[a:b])
        pos = end + 1
    return c


def _plain_uuid(raw: bytes) -> str | None:
    """The JSON string body `raw` as text when it has no escape, quote or control character
    (then it is the text itself); None otherwise (the line takes the exact path)."""
    if not raw.isascii() or b"\\" in raw or b'"' in raw:
        return None
    text = raw.decode("ascii")
    return text if text.isprintable() else None


def _exact(line: bytes) -> _Entry | None:
    """A line by json.loads: None when it is unreadable, not an object, has no string
    request_uuid, or its token_ids is null or not a list of integers (bool is not one)."""
    try:
        row = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return None
    if not isinstance(row, dict):
        return None
    uuid, ids = row.get("request_uuid"), row.get("token_ids")
    if not isinstance(uuid, str) or not isinstance(ids, list):
        return None
    if not all(type(t) is int for t in ids):
        return None
    try:
        return uuid, _Ids.of(np.array(ids, dtype=np.int64))
    except OverflowError:  # beyond int64
        return None


def _joined(c: _Chunk) -> tuple[bytes, bytes, int, int]:
    """(text, sep, count, digits): the fast lines' id lists joined by their shape's separator,
    that separator, how many ids they hold and how many digits they have; count -1 when the text
    is not digits between single separators (the chunk then takes the exact path)."""
    sep = c.shape.sep if c.shape else b","
    text = sep.join(c.pieces)
    c.pieces.clear()
    rest = text.translate(None, _DIGITS)
    if rest != sep * max(c.count - 1, 0):
        return b"", sep, -1, 0
    return text, sep, c.count, len(text) - len(rest)


def _parsed(text: bytes, sep: bytes, count: int, digits: int) -> _Ids | None:
    """The `count` ids of `text` (_joined: digit strings between single `sep`), or None when they
    do not check out: numpy parses exactly `count` ids, no item is empty (numpy reads one as 0),
    and the ids are written in `digits` digits, which each id needs at least (so none has a
    leading zero). Parsed as int32 (4 bytes an id while parsing); an id past 2**31 wraps, to a
    negative id, one whose digits differ or one >= 10**9: then the text is parsed as int64, where
    an id past 2**63 saturates to int64's greatest value."""
    if count < 0:
        return None
    for dtype, limit in ((np.int32, 10**9), (np.int64, _INT64_MAX)):
        try:
            values = np.fromstring(text, dtype=dtype, sep=",")
        except ValueError:
            return None
        if len(values) != count or (count and _has_empty(text, sep, values)):
            return None
        ids = _Ids.of(values)
        del values
        if ids.lo >= 0 and ids.hi < limit and _digits(ids) == digits:
            return ids
    return None


def _has_empty(text: bytes, sep: bytes, values: np.ndarray) -> bool:
    """Whether an item of `text` (digits between single `sep`) is empty: only when some id is 0
    (numpy reads an empty item as 0), then where a separator starts or ends the text, or
    follows another."""
    if np.count_nonzero(values == 0) == 0:
        return False
    chars = np.frombuffer(text, dtype=np.uint8)
    first, last = sep[0], sep[-1]
    return bool(
        chars[0] == first
        or chars[-1] == last
        or ((chars[:-1] == last) & (chars[1:] == first)).any()
    )


def _digits(ids: _Ids) -> int:
    """The digits the ids are written in (non-negative ids, no leading zeros)."""
    total, power = len(ids.values), 10
    while power <= ids.hi:
        total += int(np.count_nonzero(ids.values >= power))
        power *= 10
    return total


def _finished(c: _Chunk, parsed: "Future[_Ids | None]", sink: Sink) -> None:
    """The chunk's lines into the sink; a chunk whose ids did not check out read by
    json.loads."""
    ids = parsed.result()
    if ids is None and c.count:
        lines = c.data[: c.stop].split(b"\n")
        c.entries = [e for e in map(_exact, lines) if e is not None]
        c.count = 0
    c.data = b""
    fast = ids.values if ids is not None and c.count else None
    sink.chunk(fast, [(u, w if isinstance(w, slice) else w.values) for u, w in c.entries])


# segments of ids: above glibc's greatest mmap threshold (32 MiB), so each is mapped apart from
# the heap, where the chunks' temporaries would otherwise hold freed memory between them
_SEGMENT_BYTES = 64 << 20


class _Store:
    """The fast lines' ids end to end in a few large arrays (segments) of one dtype, widened
    when an id needs it, and where each line's ids are: (segment, start, stop) or its own ids.

    A segment is allocated whole but only the pages written are resident; a full one is shrunk
    to its ids in place (ndarray.resize: realloc, for an array this size a remap, not a copy)."""

    def __init__(self) -> None:
        self.segments: list[np.ndarray] = []
        self.used = 0  # ids in the last segment
        self.dtype = np.dtype(np.uint16)
        self.lines: dict[str, tuple[int, int, int] | np.ndarray] = {}

    def chunk(self, ids: np.ndarray | None, lines: list[tuple[str, slice | np.ndarray]]) -> None:
        segment, at = self.add(ids)
        for uuid, where in lines:
            if isinstance(where, slice):
                self.lines[uuid] = (segment, at + where.start, at + where.stop)
            else:
                self.lines[uuid] = where

    def add(self, ids: np.ndarray | None) -> tuple[int, int]:
        """(segment, start): where the ids were put (no ids: (0, 0))."""
        if ids is None or not len(ids):
            return 0, 0
        self.widen(ids)
        n = len(ids)
        if not self.segments or self.used + n > len(self.segments[-1]):
            self._close()
            size = max(_SEGMENT_BYTES // self.dtype.itemsize, n)
            self.segments.append(np.empty(size, dtype=self.dtype))
            self.used = 0
        start, self.used = self.used, self.used + n
        self.segments[-1][start : self.used] = ids
        return len(self.segments) - 1, start

    def widen(self, ids: np.ndarray) -> None:
        """The segments in a dtype that holds `ids` too."""
        dtype = np.promote_types(self.dtype, ids.dtype)
        if dtype != self.dtype:
            self._close()  # the last segment too: no unwritten capacity copied
            self.dtype = dtype
            self.segments = [s.astype(dtype) for s in self.segments]

    def _close(self) -> None:
        if self.segments:
            self.segments[-1].resize(self.used, refcheck=False)

    def result(self) -> dict[str, np.ndarray]:
        """request_uuid -> its ids, every array in the store's dtype (after every line's ids
        widened it: the narrowest dtype holding every id)."""
        own = [w for w in self.lines.values() if isinstance(w, np.ndarray) and len(w)]
        for ids in own:
            self.widen(ids)
        self._close()
        out: dict[str, np.ndarray] = {}
        empty = np.zeros(0, dtype=self.dtype)
        for uuid, where in self.lines.items():
            if isinstance(where, np.ndarray):
                out[uuid] = where.astype(self.dtype)
            else:
                segment, start, stop = where
                out[uuid] = self.segments[segment][start:stop] if stop > start else empty
        return out
