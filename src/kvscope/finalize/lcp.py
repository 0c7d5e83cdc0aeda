"""The longest common prefix of each prompt with any earlier one, on arrays (first divergence).

Same answer and algorithm as records.tokens.longest_with_earlier (sort the prompts once; the
longest common prefix with an earlier one is reached at the nearest earlier ones in sorted
order), but the piece keys are found without holding every distinct piece's bytes (a dict of
them was ~200 MB at 100k prompts): each `chunk`-token piece is hashed (finalize.blockhash, in
batches), the distinct hashes are the distinct pieces (up to hash collisions, about n^2 / 2^64
for n pieces, as for block keys), and only those are ordered, by their tokens, `_STEP` tokens
at a time and only among the pieces still tied, so memory is a few arrays per piece.
"""

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from kvscope.finalize import blockhash
from kvscope.records.tokens import longest_given_keys

_STEP = 16  # tokens compared per refinement round
_PAD = -1  # below every token id: a piece that ends first sorts first
_GROUP = 8192  # spans whose tokens are gathered at once


def longest_with_earlier(
    prompts: Sequence[Sequence[int] | np.ndarray], chunk: int = 256
) -> list[int]:
    """For each prompt, its longest common prefix with any prompt before it in the list."""
    arrays = [np.asarray(p) for p in prompts]
    ranks, offsets = piece_ranks(arrays, chunk)
    raw = ranks.astype(">u4").tobytes()  # 4 bytes a piece, as records.tokens keys them
    del ranks
    bounds = (4 * offsets).tolist()
    keys = [raw[a:b] for a, b in pairwise(bounds)]
    return longest_given_keys(arrays, keys, chunk)


def piece_ranks(arrays: Sequence[np.ndarray], chunk: int) -> tuple[np.ndarray, np.ndarray]:
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
    order = _lexicographic(arrays, owner, start, end)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[inverse.ravel()], offsets


def _lexicographic(
    arrays: Sequence[np.ndarray], owner: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """The order of the spans arrays[owner[k]][start[k] : end[k]], lexicographic by tokens.

    Sorted by their first _STEP tokens (padded with _PAD), then the runs of spans still tied
    by their next _STEP tokens, all runs in one sort (the run as the first key), until no run
    is left or the tokens are exhausted."""
    order = np.arange(len(owner))
    pos = order.copy()  # positions in `order` still tied with a neighbour, run by run
    run = np.zeros(len(owner), dtype=np.int64)  # the run of each, ascending
    depth, longest = 0, int((end - start).max(initial=0))
    while len(pos) and depth < longest:
        k = order[pos]
        cols = _columns(arrays, owner[k], start[k] + depth, end[k])
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


def _columns(
    arrays: Sequence[np.ndarray], owner: np.ndarray, begin: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """(len(owner), _STEP) int64: tokens begin .. begin + _STEP of each span, _PAD past its end.

    Filled _GROUP spans at a time, so the temporaries are those of a group, not of every span."""
    out = np.full((len(owner), _STEP), _PAD, dtype=np.int64)
    for g in range(0, len(owner), _GROUP):
        o, b, e = owner[g : g + _GROUP], begin[g : g + _GROUP], end[g : g + _GROUP]
        stop = np.maximum(np.minimum(b + _STEP, e), b)
        size = stop - b
        if not int(size.sum()):
            continue
        spans = zip(o.tolist(), b.tolist(), stop.tolist(), strict=True)
        flat = np.concatenate([arrays[k][x:y] for k, x, y in spans])
        row = np.repeat(np.arange(g, g + len(o)), size)
        col = np.arange(len(flat)) - np.repeat(np.cumsum(size) - size, size)
        out[row, col] = flat
    return out
