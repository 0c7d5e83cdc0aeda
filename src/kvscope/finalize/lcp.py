"""The longest common prefix of each prompt with any earlier one, on arrays (first divergence).

The answer of a PrefixIndex (tests/unit/oracles.py: its longest, then add, for each prompt), all
at once: the prompts are sorted once; the longest common prefix with an earlier one is reached
at the nearest earlier ones in sorted order (longest_from_sorted). The sort keys are the ranks
of the prompts' pieces (finalize.prompts: each distinct piece held once) among the distinct
pieces in lexicographic order. Those are ordered by their tokens, `_STEP` tokens at a time and
only among the pieces still tied, so memory is a few arrays per distinct piece.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from kvscope.finalize.prompts import PIECE, Prompts

_STEP = 16  # tokens compared per refinement round
_GROUP = 1 << 16  # pieces whose tokens are gathered at once


def longest_with_earlier(
    prompts: Sequence[Sequence[int] | np.ndarray], chunk: int = PIECE
) -> list[int]:
    """For each prompt, its longest common prefix with any prompt before it in the list."""
    return Pieces.of(prompts, chunk).longest_with_earlier()


@dataclass(frozen=True)
class Pieces:
    """Prompts with their distinct pieces ranked by their tokens (piece_ranks): common prefixes
    of many prompt pairs at once."""

    prompts: Prompts
    ranks: np.ndarray  # int64, per distinct piece (a row of prompts.rows)

    @classmethod
    def of(
        cls, prompts: "Prompts | Sequence[Sequence[int] | np.ndarray]", chunk: int = PIECE
    ) -> "Pieces":
        """`prompts` (a list is cut into `chunk`-token pieces; Prompts keep theirs)."""
        if not isinstance(prompts, Prompts):
            prompts = Prompts.of(prompts, chunk)
        return cls(prompts, piece_ranks(prompts))

    def longest_with_earlier(self) -> list[int]:
        """For each prompt, its longest common prefix with any prompt before it in the list."""
        p = self.prompts
        raw = self.ranks[p.seq].astype(">u4").tobytes()  # 4 bytes a piece: bytes sort as prompts
        keys = [raw[a:b] for a, b in pairwise((4 * p.offsets).tolist())]
        by_key = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
        del keys, raw
        adjacent = [0, *self.common(by_key[:-1], by_key[1:]).tolist()]
        return longest_from_sorted(by_key.tolist(), adjacent)

    def common(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The common prefix of prompts a[k] and b[k], for each k (int64): the equal leading
        pieces (one distinct piece: equal tokens), then the tokens of the next piece, all pairs
        at once."""
        p = self.prompts
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        n = np.minimum(p.lengths[a], p.lengths[b])
        counts = np.diff(p.offsets)
        pieces = np.minimum(counts[a], counts[b])
        k = np.zeros(len(a), dtype=np.int64)
        live = np.flatnonzero(pieces > 0)
        while len(live):
            same = p.seq[p.offsets[a[live]] + k[live]] == p.seq[p.offsets[b[live]] + k[live]]
            live = live[same]
            k[live] += 1
            live = live[k[live] < pieces[live]]
        out = np.minimum(k * p.piece, n)
        live = np.flatnonzero(out < n)  # they differ within their piece k (both have one)
        for g in range(0, len(live), _GROUP):
            part = live[g : g + _GROUP]
            x = p.rows[p.seq[p.offsets[a[part]] + k[part]]]
            y = p.rows[p.seq[p.offsets[b[part]] + k[part]]]
            differ = x != y  # 0 past a piece's width: the shorter prompt ends there (n)
            first = np.where(differ.any(axis=1), differ.argmax(axis=1), p.piece)
            out[part] = np.minimum(k[part] * p.piece + first, n[part])
        return out


def piece_ranks(prompts: Prompts) -> np.ndarray:
    """The rank of every distinct piece (a row of prompts.rows) among them in lexicographic
    order of their tokens (a piece that is a prefix of another comes first)."""
    order = _lexicographic(prompts.rows, prompts.width)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def _lexicographic(rows: np.ndarray, width: np.ndarray) -> np.ndarray:
    """The order of the pieces rows[k][: width[k]], lexicographic by tokens.

    Sorted by their first _STEP tokens, then the runs of pieces still tied by their next _STEP
    tokens, all runs in one sort (the run as the first key), until no run is left or the tokens
    are exhausted. Each round's key is the tokens' bytes (_keys), which sort as the tokens do."""
    order = np.arange(len(rows))
    pos = order.copy()  # positions in `order` still tied with a neighbour, run by run
    run = np.zeros(len(rows), dtype=np.int64)  # the run of each, ascending
    lo = int(rows.min()) if rows.size else 0
    depth = 0
    while len(pos) and depth < rows.shape[1]:
        k = order[pos]
        keys = _keys(rows, width, k, depth, lo)
        sub = np.lexsort((keys, run)) if depth else np.argsort(keys, kind="stable")
        order[pos] = k[sub]
        keys = keys[sub]
        same = (keys[1:] == keys[:-1]) & (run[1:] == run[:-1])
        keep = np.zeros(len(pos), dtype=bool)
        keep[:-1] |= same
        keep[1:] |= same
        run = np.cumsum(np.concatenate([[True], ~same]))[keep]
        pos = pos[keep]
        depth += _STEP
    return order


def _keys(rows: np.ndarray, width: np.ndarray, k: np.ndarray, depth: int, lo: int) -> np.ndarray:
    """Tokens depth .. depth + _STEP of pieces k as one bytes value each, which compare as the
    token sequences do: each token t as big-endian t - lo + 1 (`lo`: the least token), 0 past
    a piece's width (below every token). Built _GROUP pieces at a time."""
    stop = min(depth + _STEP, rows.shape[1])
    big = int(rows.max()) - lo + 1 >= 1 << 32 if rows.size else False
    unit = np.dtype(">u8" if big else ">u4")
    out = np.zeros((len(k), stop - depth), dtype=unit)
    cols = np.arange(depth, stop)
    shift = np.uint64((1 - lo) % (1 << 64))  # t - lo + 1, modulo 2**64: exact for t >= lo
    for g in range(0, len(k), _GROUP):
        part = k[g : g + _GROUP]
        with np.errstate(over="ignore"):
            got = rows[part, depth:stop].astype(np.int64).view(np.uint64) + shift
        got[cols >= width[part][:, None]] = 0
        out[g : g + _GROUP] = got
    return out.view(f"S{out.shape[1] * unit.itemsize}").ravel()


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
