"""A chunk's id lists found and read by compiled code: one pass over its bytes, no copy.

`find_lists(text, key, dtype)` takes whole lines of a JSONL file (`text`, each line ended by a
newline) and, on each line that is not blank, finds `key` (`"name"`, once in the line), then a
colon and a `[`, and reads the list up to its `]` into one flat array of `dtype` (int64 or
uint64) with a count per line: what sim/inputs/chunks.py's numpy path does by splitting the
lines, cutting the lists out, joining them and calling `np.fromstring`, in one pass at
~0.7-1.4 ns a byte (~7 ns a token id of up to five digits) instead of four copies and ~25 ns
an id. It returns, per line read, its index among the text's lines and where it starts, its
list's `[` and `]`, and where it ends, so the caller parses the rest of the line (orjson) and
checks that the list was the field's own (the name only once in the line: a nested object's
field of that name could otherwise pass for it where the field's own list is empty).

It reads plain lists only: decimal integers from 0 to dtype's maximum, separated by commas,
with spaces around them (json.dumps's ", "); an empty list is allowed. Anything else on any
line (no such key or the key twice, a sign, a fraction, an exponent, `true`, a string, an
empty element, an integer beyond the maximum) makes it return None, and the caller reads the
chunk another way, which refuses what is wrong with the line's number. numba is loaded on
first use (sim/caches/compiled.py).
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import compiled

# The bytes b"\n", b",", b" ", b"0", b"[", b"]", b":"
_NL, _COMMA, _SPACE, _ZERO, _OPEN, _CLOSE, _COLON = 10, 44, 32, 48, 91, 93, 58
SPAN = ("line", "start", "open", "close", "end")  # a row of the spans find_lists returns


def find_lists(
    text: bytes, key: bytes, dtype: type
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(spans: a row per line that is not blank, its columns SPAN; the ids of the lines'
    lists, flat, as `dtype`; how many each line's list has; how many lines `text` has, blank
    ones included), or None where a line is not as the module doc says. `text` ends with a
    newline."""
    if not text.endswith(b"\n"):
        raise ValueError("text must be whole lines, each ended by a newline")
    most = len(text) // (len(key) + 4) + 1  # a line read holds at least `key:[]` and its end
    ids = np.empty(len(text) // 2 + 1, dtype=np.uint64)  # an id takes a digit and an end
    spans = np.empty((most, len(SPAN)), dtype=np.int64)
    counts = np.empty(most, dtype=np.int64)
    limit = np.uint64(np.iinfo(dtype).max)
    words = np.frombuffer(text, dtype=np.uint8)
    rows, n, lines = _scan(words, np.frombuffer(key, dtype=np.uint8), limit, spans, ids, counts)
    if rows < 0:
        return None
    # spans and counts copied out of their room (a row per few bytes): a caller keeps counts
    return spans[:rows].copy(), ids[:n].view(dtype), counts[:rows].copy(), lines


@compiled()
def _space(c: np.uint8) -> bool:
    """What bytes.strip() strips: space, tab, newline, carriage return, vertical tab, form feed."""
    return c == _SPACE or 9 <= c <= 13


@compiled()
def _scan(
    text: np.ndarray,
    key: np.ndarray,
    limit: np.uint64,
    spans: np.ndarray,
    ids: np.ndarray,
    counts: np.ndarray,
) -> tuple[int, int, int]:
    """Fill `spans`, `ids` and `counts` from `text` (lines, each ended by a newline, the last
    byte: no run of digits or spaces goes past a line's end); (rows filled, ids read, lines
    in `text`), or (-1, 0, 0) where a line is not as find_lists says."""
    n = 0
    rows = 0
    line = 0
    start = 0
    while start < len(text):
        k = start
        while text[k] != _NL and _space(text[k]):
            k += 1
        if text[k] != _NL:  # not blank
            at = _find(text, key, k)
            if at < 0:
                return -1, 0, 0
            k = at + len(key)
            while text[k] != _NL and _space(text[k]):
                k += 1
            if text[k] != _COLON:
                return -1, 0, 0
            k += 1
            while text[k] != _NL and _space(text[k]):
                k += 1
            if text[k] != _OPEN:
                return -1, 0, 0
            close, read = _list(text, k + 1, limit, ids, n)
            if close < 0:
                return -1, 0, 0
            spans[rows, 0] = line
            spans[rows, 1] = start
            spans[rows, 2] = k
            spans[rows, 3] = close
            if _find(text, key, close) >= 0:
                return -1, 0, 0  # the name again: a nested field's list may have been taken
            k = close
            while text[k] != _NL:
                k += 1
            spans[rows, 4] = k
            counts[rows] = read - n
            n = read
            rows += 1
        line += 1
        start = k + 1
    return rows, n, line


@compiled()
def _find(text: np.ndarray, key: np.ndarray, start: int) -> int:
    """Where `key` first is in text from `start` to the line's end, or -1."""
    size = len(key)
    i = start
    while text[i] != _NL:
        if text[i] == key[0]:
            j = 1
            while j < size and text[i + j] == key[j]:
                j += 1
            if j == size:
                return i
        i += 1
    return -1


@compiled()
def _list(text: np.ndarray, i: int, limit: np.uint64, ids: np.ndarray, n: int) -> tuple[int, int]:
    """The list's ids from text[i] (after its `[`) into ids[n:]: (where its `]` is, the ids'
    end in `ids`), or (-1, n) where it is not plain. An id of up to 18 digits fits in 63 bits:
    only the 19th digit on is checked against `limit`."""
    ten, zero = np.uint64(10), np.uint64(_ZERO)
    while text[i] == _SPACE:
        i += 1
    if text[i] == _CLOSE:
        return i, n  # an empty list
    while True:
        d = np.uint64(text[i]) - zero  # wraps around below b"0": a digit is d < 10
        if d >= ten:
            return -1, n  # not an id: an empty element, a sign, a string...
        value, unchecked = d, i + 18
        i += 1
        d = np.uint64(text[i]) - zero
        while d < ten and i < unchecked:
            value = value * ten + d
            i += 1
            d = np.uint64(text[i]) - zero
        while d < ten:
            if value > (limit - d) // ten:
                return -1, n  # beyond dtype's maximum
            value = value * ten + d
            i += 1
            d = np.uint64(text[i]) - zero
        ids[n] = value
        n += 1
        while text[i] == _SPACE:
            i += 1
        if text[i] == _CLOSE:
            return i, n
        if text[i] != _COMMA:
            return -1, n  # two ids with no comma between, or another character
        i += 1
        while text[i] == _SPACE:
            i += 1
