"""The prompt-token stream (prompt_tokens.jsonl): each call's exact prompt token ids, appended as
the call is sent, so that `kvscope convert` can match a crashed run's prompts to KV blocks; and
the prefix relation between token sequences that the first-divergence columns are defined by."""

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.records.base import read_jsonl, record_dict

TOKENS_JSONL = "prompt_tokens.jsonl"


@dataclass(frozen=True)
class PromptTokenIds:
    request_uuid: str
    token_ids: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


def load_tokens(run_dir: Path) -> dict[str, list[int]]:
    """request_uuid -> its prompt token ids; empty when the run has no stream."""
    path = run_dir / TOKENS_JSONL
    rows = read_jsonl(path)[0] if path.exists() else []
    return {r["request_uuid"]: r["token_ids"] for r in rows}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix: the first index where a and b differ."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixIndex:
    """Longest common prefix of a sequence with any sequence added before, in O(L log n).

    Among sorted sequences, the longest common prefix with a query is reached at the query's
    sorted neighbours, so only two comparisons are needed per query.
    """

    def __init__(self) -> None:
        self._sorted: list[tuple[int, ...]] = []

    def longest(self, ids: Sequence[int]) -> int:
        key = tuple(ids)
        i = bisect_left(self._sorted, key)
        near = self._sorted[max(i - 1, 0) : i + 1]
        return max((common_prefix(key, s) for s in near), default=0)

    def add(self, ids: Sequence[int]) -> None:
        key = tuple(ids)
        self._sorted.insert(bisect_left(self._sorted, key), key)
