"""Slow, plain reference answers that the vectorised code in src is tested against.

- PrefixIndex: the longest common prefix of each prompt with any earlier one, by sorting and
  bisecting (the oracle of finalize.lcp);
- first_windows: records.blockkey.first_windows_of_sorted for queries in any order, with
  repeats (the oracle of finalize.piecehash's windows).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

from kvscope.records.blockkey import Batches, Tokens, first_windows_of_sorted
from kvscope.records.tokens import common_prefix

_KEY = np.dtype(">u4")  # big-endian: bytes compare as the token sequences do


def _key(ids: Sequence[int] | np.ndarray) -> bytes:
    a = np.asarray(ids)
    if len(a) and (a.min() < 0 or a.max() > 0xFFFF_FFFF):
        raise ValueError("PrefixIndex holds token ids in [0, 2**32)")
    return a.astype(_KEY).tobytes()


def _common_bytes(a: bytes, b: bytes) -> int:
    return common_prefix(np.frombuffer(a, dtype=_KEY), np.frombuffer(b, dtype=_KEY))


class PrefixIndex:
    """Longest common prefix of a sequence with any sequence added before, in O(L + log n).

    Among sorted sequences, the longest common prefix with a query is reached at the query's
    sorted neighbours, so only two comparisons are needed per query. Sequences are held as
    big-endian 4-byte token ids (4 bytes a token: ids must lie in [0, 2**32)), whose byte order
    is the sequences' lexicographic order, so the search is bytes comparisons.
    """

    def __init__(self) -> None:
        self._sorted: list[bytes] = []

    def longest(self, ids: Sequence[int] | np.ndarray) -> int:
        key = _key(ids)
        i = bisect_left(self._sorted, key)
        return max((_common_bytes(key, s) for s in self._sorted[max(i - 1, 0) : i + 1]), default=0)

    def add(self, ids: Sequence[int] | np.ndarray) -> None:
        key = _key(ids)
        self._sorted.insert(bisect_left(self._sorted, key), key)


def first_windows(
    prompts: Sequence[Tokens] | Batches, size: int, queries: np.ndarray
) -> np.ndarray:
    """For each query hash: the index of the first prompt holding a window (`size` consecutive
    tokens at any offset) with that hash; len(prompts) where none does."""
    uniq, inverse = np.unique(queries, return_inverse=True)
    return first_windows_of_sorted(prompts, size, uniq)[inverse]
