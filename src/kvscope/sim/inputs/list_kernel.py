"""A chunk's id lists read by compiled code: one pass over their bytes, digits to integers.

`read_lists(texts, dtype)` reads the bodies of JSON lists (what lies between a line's `[` and
`]`) into one flat array of `dtype` (int64 or uint64) and a count per list, as
sim/inputs/chunks.py's numpy path does with `np.fromstring`, at ~1.5 ns a byte (~8 ns a
five-digit token id) instead of ~25 ns an id. It reads plain lists only: decimal integers
from 0 to dtype's maximum, separated by commas, with spaces around them (json.dumps's ", ");
an empty list is allowed. Anything else (a sign, a fraction, an exponent, `true`, a string,
an empty element, an integer beyond the maximum) makes it return None, and the caller reads the
chunk line by line, which refuses what is wrong with the line's number. numba is loaded on first use (sim/caches/compiled.py).
"""

from __future__ import annotations

import numpy as np

from kvscope.sim.caches.compiled import compiled

_NL, _COMMA, _SPACE, _ZERO = 10, 44, 32, 48  # the bytes b"\n", b",", b" ", b"0"


def read_lists(texts: list[bytes], dtype: type) -> tuple[np.ndarray, np.ndarray] | None:
    """(the ids of the lists `texts`, flat, as `dtype`; how many each list has), or None where
    a list is not plain (see the module doc)."""
    joined = b"\n".join(texts) + b"\n"  # no line holds a newline: it ends each list
    ids = np.empty(len(joined) // 2 + 1, dtype=np.uint64)  # an id takes a digit and an end
    counts = np.zeros(len(texts), dtype=np.int64)
    if not texts:
        return ids[:0].view(dtype), counts
    limit = np.uint64(np.iinfo(dtype).max)
    n = _parse(np.frombuffer(joined, dtype=np.uint8), limit, ids, counts)
    return None if n < 0 else (ids[:n].view(dtype), counts)


@compiled()
def _parse(text: np.ndarray, limit: np.uint64, ids: np.ndarray, counts: np.ndarray) -> int:
    """Fill `ids` and `counts` from `text` (lists, each ended by a newline, the last byte: no
    run of digits or spaces goes past it); the ids' number, or -1 where a list is not plain.
    An id of up to 18 digits fits in 63 bits: only the 19th digit on is checked against
    `limit`."""
    ten, zero = np.uint64(10), np.uint64(_ZERO)
    n = 0
    lists = 0
    first = 0  # where the current list's ids start in `ids`
    i = 0
    while i < len(text):
        d = np.uint64(text[i]) - zero  # wraps around below b"0": a digit is d < 10
        if d < ten:  # an id, then spaces, then a comma and the next id, or the list's end
            value, unchecked = d, i + 18
            i += 1
            d = np.uint64(text[i]) - zero
            while d < ten and i < unchecked:
                value = value * ten + d
                i += 1
                d = np.uint64(text[i]) - zero
            while d < ten:
                if value > (limit - d) // ten:
                    return -1  # beyond dtype's maximum
                value = value * ten + d
                i += 1
                d = np.uint64(text[i]) - zero
            ids[n] = value
            n += 1
            while text[i] == _SPACE:
                i += 1
            if text[i] == _COMMA:
                i += 1
                while text[i] == _SPACE:
                    i += 1
                if np.uint64(text[i]) - zero >= ten:
                    return -1  # an empty element or a trailing comma
            elif text[i] != _NL:
                return -1  # two ids with no comma between, or another character
        elif text[i] == _NL:
            counts[lists] = n - first
            lists += 1
            first = n
            i += 1
        elif text[i] == _SPACE and n == first:  # spaces before a list's first id
            i += 1
        else:
            return -1
    return n
