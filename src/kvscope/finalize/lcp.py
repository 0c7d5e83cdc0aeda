"""The longest common prefix of each prompt with any earlier one, on arrays (first divergence).

The answer of records.tokens.PrefixIndex (its longest, then add, for each prompt in turn), all
at once: the prompts are sorted once; the longest common prefix with an earlier one is reached
at the nearest earlier ones in sorted order (longest_from_sorted). The sort keys are the ranks
of the prompts' `chunk`-token pieces, found without holding every distinct piece's bytes (a
dict of them was ~200 MB at 100k prompts): each piece is hashed (finalize.blockhash, in
batches), the distinct hashes are the distinct pieces (up to hash collisions, about n^2 / 2^64
for n pieces, as for block keys), and only those are ordered, by their tokens, `_STEP` tokens
at a time and only among the pieces still tied, so memory is a few arrays per piece.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from kvscope.finalize import blockhash
from kvscope.finalize.flatten import Flat
from kvscope.records.tokens import common_prefix

_STEP = 16  # tokens compared per refinement round
_GROUP = 1 << 16  # spans whose tokens are gathered at once


def longest_with_earlier(
    prompts: Sequence[Sequence[int] | np.ndarray], chunk: int = 256
) -> list[int]:
    """For each prompt, its longest common prefix with any prompt before it in the list."""
    return Pieces.of([np.asarray(p) for p in prompts], chunk).longest_with_earlier()


@dataclass(frozen=True)
class Pieces:
    """Prompts cut into `chunk`-token pieces ranked by their tokens (piece_ranks), addressed in
    their flat arrays (finalize.flatten): common prefixes of many prompt pairs at once."""

    arrays: Sequence[np.ndarray]
    flat: Flat
    lengths: np.ndarray  # int64, per prompt
    ranks: np.ndarray  # int64, flat: prompt i's pieces are [offsets[i], offsets[i + 1])
    offsets: np.ndarray
    chunk: int

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray], chunk: int = 256) -> "Pieces":
        flat = Flat.of(arrays)
        ranks, offsets = piece_ranks(arrays, chunk, flat)
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        return cls(arrays, flat, lengths, ranks, offsets, chunk)

    def longest_with_earlier(self) -> list[int]:
        """For each prompt, its longest common prefix with any prompt before it in the list."""
        raw = self.ranks.astype(">u4").tobytes()  # 4 bytes a piece: bytes sort as the prompts
        keys = [raw[a:b] for a, b in pairwise((4 * self.offsets).tolist())]
        by_key = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
        del keys, raw
        adjacent = [0, *self.common(by_key[:-1], by_key[1:]).tolist()]
        return longest_from_sorted(by_key.tolist(), adjacent)

    def common(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The common prefix of prompts a[k] and b[k], for each k (int64): the equal leading
        pieces (their ranks, all pairs at once), then the tokens of the next piece."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        n = np.minimum(self.lengths[a], self.lengths[b])
        pieces = np.minimum(np.diff(self.offsets)[a], np.diff(self.offsets)[b])
        k = np.zeros(len(a), dtype=np.int64)
        live = np.flatnonzero(pieces > 0)
        while len(live):
            same = (
                self.ranks[self.offsets[a[live]] + k[live]]
                == self.ranks[self.offsets[b[live]] + k[live]]
            )
            live = live[same]
            k[live] += 1
            live = live[k[live] < pieces[live]]
        out = np.minimum(k * self.chunk, n)
        live = np.flatnonzero(out < n)
        starts = out[live].tolist()
        for i, x, y, s in zip(
            live.tolist(), a[live].tolist(), b[live].tolist(), starts, strict=True
        ):
            e = s + self.chunk  # within the first piece that differs (numpy's compare per pair
            # beat a vectorised gather of both spans: ~2.5 us a pair, against ~3.5)
            out[i] = s + common_prefix(self.arrays[x][s:e], self.arrays[y][s:e])
        return out


def piece_ranks(
    arrays: Sequence[np.ndarray], chunk: int, flat: Flat | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, offsets): the rank of every `chunk`-token piece (the last of a prompt possibly
    shorter) among the distinct pieces in lexicographic order, flat: prompt i's pieces are
    [offsets[i], offsets[i + 1])."""
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    counts = -(-lengths // chunk)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    hashes = blockhash.piece_hashes(arrays, chunk)
    if not len(hashes):
        return hashes.astype(np.int64), offsets
    uniq_first, inverse = np.unique(hashes, return_index=True, return_inverse=True)[1:]
    del hashes
    owner = np.searchsorted(offsets, uniq_first, side="right") - 1  # a prompt holding each
    start = (uniq_first - offsets[owner]) * chunk
    end = np.minimum(start + chunk, lengths[owner])
    order = _lexicographic(flat or Flat.of(arrays), owner, start, end)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[inverse.ravel()], offsets


def _lexicographic(flat: Flat, owner: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The order of the spans arrays[owner[k]][start[k] : end[k]], lexicographic by tokens.

    Sorted by their first _STEP tokens (padded with flatten.PAD), then the runs of spans still tied
    by their next _STEP tokens, all runs in one sort (the run as the first key), until no run
    is left or the tokens are exhausted."""
    order = np.arange(len(owner))
    pos = order.copy()  # positions in `order` still tied with a neighbour, run by run
    run = np.zeros(len(owner), dtype=np.int64)  # the run of each, ascending
    depth, longest = 0, int((end - start).max(initial=0))
    while len(pos) and depth < longest:
        k = order[pos]
        cols = _columns(flat, owner[k], start[k] + depth, end[k])
        sub = np.lexsort((*cols.T[::-1], run))  # the last key is the first
        order[pos] = k[sub]
        cols = cols[sub]
        same = (cols[1:] == cols[:-1]).all(axis=1) & (run[1:] == run[:-1])
        keep = np.zeros(len(pos), dtype=bool)
        keep[:-1] |= same
        keep[1:] |= same
        run = np.cumsum(np.concatenate([[True], ~same]))[keep]
        pos = pos[keep]
        depth += _STEP
    return order


def _columns(flat: Flat, owner: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """(len(owner), _STEP) int64: tokens begin .. begin + _STEP of each span, PAD past its end.

    Gathered _GROUP spans at a time, so the temporaries are those of a group, not of every span."""
    out = np.empty((len(owner), _STEP), dtype=np.int64)
    for g in range(0, len(owner), _GROUP):
        part = slice(g, g + _GROUP)
        out[part] = flat.gather(owner[part], begin[part], end[part], _STEP)
    return out


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
