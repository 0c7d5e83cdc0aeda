"""The prompt-token stream (prompt_tokens.jsonl): each call's exact prompt token ids, appended as
the call is sent, so that `kvscope convert` can match a crashed run's prompts to KV blocks; and
the prefix relation between token sequences that the first-divergence columns are defined by."""

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
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


def longest_with_earlier(
    prompts: Sequence[Sequence[int] | np.ndarray], chunk: int = 256
) -> list[int]:
    """For each sequence, its longest common prefix with any sequence before it in the list:
    PrefixIndex.longest then add for each in turn, all at once in O(L + n log n).

    The sequences are sorted once; the longest common prefix of q with an earlier sequence is
    reached at q's nearest earlier ones in sorted order (one on each side), and is the least
    common prefix of the adjacent pairs between. The sort key of a sequence is the ranks of its
    `chunk`-token pieces among all distinct pieces in lexicographic order (4 bytes a piece, the
    last piece possibly shorter): the order of the sequences, in 4 / chunk bytes a token.
    """
    arrays = [np.asarray(p) for p in prompts]
    return longest_given_keys(arrays, _piece_keys(arrays, chunk), chunk)


def longest_given_keys(
    arrays: Sequence[np.ndarray], keys: Sequence[bytes], chunk: int
) -> list[int]:
    """longest_with_earlier, given the sequences' piece keys: keys[i] holds one big-endian 4-byte
    id per `chunk`-token piece of arrays[i], equal ids for equal pieces, and ids ordered as the
    pieces are lexicographically (so the keys sort as the sequences do)."""
    n = len(arrays)
    by_key = sorted(range(n), key=keys.__getitem__)
    adjacent = [0] * n  # adjacent[i]: the common prefix of sorted i - 1 and sorted i
    for i in range(1, n):
        a, b = by_key[i - 1], by_key[i]
        j = min(_common_pieces(keys[a], keys[b]) * chunk, len(arrays[a]), len(arrays[b]))
        adjacent[i] = j + common_prefix(arrays[a][j : j + chunk], arrays[b][j : j + chunk])
    return longest_from_sorted(by_key, adjacent)


def longest_from_sorted(by_key: Sequence[int], adjacent: Sequence[int]) -> list[int]:
    """For each sequence, its longest common prefix with any sequence before it in the list,
    given the sequences' lexicographic order (`by_key`: list indices, sorted) and the common
    prefix of each sorted neighbour pair (`adjacent[i]`: of sorted i - 1 and i; adjacent[0]
    unused). The nearest earlier sequence on each side in sorted order is found with a stack;
    the common prefix with it is the least adjacent one between."""
    n = len(by_key)
    out = [0] * n
    for side, step in ((range(n), 0), (range(n - 1, -1, -1), 1)):
        # [list index, least adjacent common prefix from it to the entry above / the position]
        stack: list[list[int]] = []
        for i in side:
            q = by_key[i]
            if stack:
                stack[-1][1] = min(stack[-1][1], adjacent[i + step])
                while stack and stack[-1][0] > q:  # later than q: never nearest earlier again
                    least = stack.pop()[1]
                    if stack:
                        stack[-1][1] = min(stack[-1][1], least)
                if stack:
                    out[q] = max(out[q], stack[-1][1])
            stack.append([q, 1 << 62])
    return out


def _common_pieces(a: bytes, b: bytes) -> int:
    """The leading 4-byte ids two piece keys share (keys are short: a loop beats numpy)."""
    w, n = _KEY.itemsize, min(len(a), len(b))
    k = 0
    while k < n and a[k : k + w] == b[k : k + w]:
        k += w
    return k // w


def _piece_keys(arrays: Sequence[np.ndarray], chunk: int, group: int = 512) -> list[bytes]:
    """Each sequence's pieces' lexicographic ranks, as big-endian 4-byte ids (see the caller)."""
    width = _KEY.itemsize * chunk
    ranks: dict[bytes, int] = {}  # distinct piece -> its id, then its rank
    ids: list[int] = []
    bounds = [0]
    for g in range(0, len(arrays), group):
        some = [a for a in arrays[g : g + group] if len(a)]
        flat = _key(np.concatenate(some)) if some else b""
        end = 0
        for a in arrays[g : g + group]:
            start, end = end, end + _KEY.itemsize * len(a)
            ids += [
                ranks.setdefault(flat[s : min(s + width, end)], len(ranks))
                for s in range(start, end, width)
            ]
            bounds.append(len(ids))
    rank = np.empty(len(ranks), dtype=np.int64)
    rank[[ranks[p] for p in sorted(ranks)]] = np.arange(len(ranks))
    keys = rank[ids].astype(_KEY).tobytes()
    w = _KEY.itemsize
    return [keys[w * a : w * b] for a, b in pairwise(bounds)]
