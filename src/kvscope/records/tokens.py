"""The prompt-token stream (prompt_tokens.jsonl): each call's exact prompt token ids, appended as
the call is sent, so that `kvscope convert` can match a crashed run's prompts to KV blocks; and
the prefix relation between token sequences that the first-divergence columns are defined by."""

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.records.base import record_dict
from kvscope.records.token_lines import read_token_ids

TOKENS_JSONL = "prompt_tokens.jsonl"


@dataclass(frozen=True)
class PromptTokenIds:
    request_uuid: str
    token_ids: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


def load_tokens(run_dir: Path) -> dict[str, np.ndarray]:
    """request_uuid -> its prompt token ids, as integer arrays; empty when the run has no stream.

    Every array has one dtype, the smallest holding every id of the stream: uint16 when all lie
    in [0, 2**16) (2 bytes a token: vocabularies up to 65,536), else int32, else int64. The
    arrays are views of a few flat arrays (records.token_lines reads the stream in chunks: ~2 s
    for 800 MB).
    A line that is not a JSON object with a string request_uuid and a list of integer token_ids
    (a line torn by a crash) is skipped; a line whose token_ids is null is ignored; a
    request_uuid written twice keeps its last line. Consumers must not assume a signed dtype:
    widen (astype) before arithmetic that can leave [0, 2**16).
    """
    path = run_dir / TOKENS_JSONL
    return read_token_ids(path) if path.exists() else {}


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix: the first index where a and b differ."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.asarray(a[:n]) != np.asarray(b[:n])
    i = int(differ.argmax())  # the first True, or 0 when there is none
    return i if differ[i] else n


_KEY = np.dtype(">u4")  # big-endian: bytes compare as the token sequences do


def _key(ids: Sequence[int] | np.ndarray) -> bytes:
    a = np.asarray(ids)
    if len(a) and (a.min() < 0 or a.max() > 0xFFFF_FFFF):
        raise ValueError("PrefixIndex holds token ids in [0, 2**32)")
    return a.astype(_KEY).tobytes()


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


def _common_bytes(a: bytes, b: bytes) -> int:
    return common_prefix(np.frombuffer(a, dtype=_KEY), np.frombuffer(b, dtype=_KEY))
