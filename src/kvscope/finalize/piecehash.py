"""Block keys and token windows of Prompts, computed on their distinct content.

blockkey hashes every token of every prompt. On Prompts (finalize.prompts: each distinct piece
held once) most of that repeats:
- prompt_blocks: a block within a piece has its key from the piece's own running sum at the
  block's end (blockkey.row_sums, once per distinct piece) chained on the sums of the pieces
  before it in the prompt, so the per-token work is over the distinct pieces only;
- first_windows_of_sorted: a window within a piece is held by every prompt holding the piece,
  and one across two pieces by every prompt holding the two in a row; so the windows of each
  distinct piece, and of each distinct pair of consecutive pieces (the tail of the first, the
  head of the second), are hashed once, each answering for the first prompt holding it: on a
  PEER-like run with 16-token blocks, a third of the tokens are hashed. Where windows are as
  long as a piece, the pairs' tokens approach every prompt's, and every window is hashed
  instead.
Both give exactly what blockkey gives on the prompts' tokens.
"""

from collections.abc import Sequence

import numpy as np

from kvscope.finalize.prompts import Prompts, Tokens
from kvscope.records import blockkey

_MOST_PER_PIECE = 16  # block ends a piece for prompt_blocks (its sums: 8 bytes each)
# the pieces' and pairs' tokens hashed against every prompt's: above this share, hashing every
# window is as fast (a pair's tokens are gathered first; at 100k PEER-like calls with 128-token
# blocks, 0.74 of them took 1.34 s against 1.29 s)
WORTH = 0.6


class _Distinct:
    """The distinct pieces as blockkey.Batches (each piece a prompt)."""

    def __init__(self, prompts: Prompts) -> None:
        self.rows, self.lengths = prompts.rows, prompts.width

    def concat(self, lo: int, hi: int) -> np.ndarray:
        rows, width = self.rows[lo:hi], self.lengths[lo:hi]
        return rows[np.arange(rows.shape[1]) < width[:, None]]


class _Junctions:
    """Pairs of pieces as blockkey.Batches: pair k is the last `k` tokens of piece a[k] (a
    whole piece: one followed by another) then the first `k` of piece b[k] (fewer when it is
    shorter): every window of `k + 1` tokens in it spans the two."""

    def __init__(self, prompts: Prompts, a: np.ndarray, b: np.ndarray, k: int) -> None:
        self.rows, self.a, self.b, self.k = prompts.rows, a, b, k
        self.lengths = k + np.minimum(prompts.width[b], k)

    def concat(self, lo: int, hi: int) -> np.ndarray:
        tail = self.rows[self.a[lo:hi], self.rows.shape[1] - self.k :]
        both = np.concatenate([tail, self.rows[self.b[lo:hi], : self.k]], axis=1)
        return both[np.arange(2 * self.k) < self.lengths[lo:hi, None]]


def first_windows_of_sorted(
    prompts: Prompts, size: int, uniq: np.ndarray, worth: float = WORTH
) -> np.ndarray:
    """blockkey.first_windows_of_sorted(prompts, size, uniq): for each sorted, distinct query
    hash, the first prompt holding a window of `size` tokens with it (len(prompts): none).
    Found on the pieces and pairs unless they hold more than `worth` of the prompts' tokens."""
    n = len(prompts)
    if size > prompts.piece or not n or not len(uniq):  # a window may span three pieces
        return blockkey.first_windows_of_sorted(prompts, size, uniq)
    counts = np.diff(prompts.offsets)
    followed = np.ones(len(prompts.seq), dtype=bool)  # a piece with another after it
    followed[prompts.offsets[1:][counts > 0] - 1] = False
    at = np.flatnonzero(followed)
    pair = prompts.seq[at] * len(prompts.rows) + prompts.seq[at + 1]
    first = at[np.unique(pair, return_index=True)[1]]  # its first place: its first prompt's
    del pair, at
    hashed = int(prompts.width.sum()) + len(first) * 2 * (size - 1)
    if hashed > worth * int(prompts.lengths.sum()):  # little shared, or windows near a piece
        return blockkey.first_windows_of_sorted(prompts, size, uniq)
    holder = np.repeat(np.arange(n, dtype=np.int64), counts)  # the prompt of each piece held
    first_of = np.full(len(prompts.rows), n, dtype=np.int64)
    np.minimum.at(first_of, prompts.seq, holder)
    found = blockkey.first_windows_of_sorted(_Distinct(prompts), size, uniq, first_of, n)
    if size == 1:
        return found
    junctions = _Junctions(prompts, prompts.seq[first], prompts.seq[first + 1], size - 1)
    across = blockkey.first_windows_of_sorted(junctions, size, uniq, holder[first], n)
    return np.minimum(found, across)


def prompt_blocks(
    prompts: "Prompts | Sequence[Tokens]", size: int, hashes: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """blockkey.prompt_blocks(prompts, size, hashes): (keys, hashes, offsets) of every full
    block of every prompt, from the distinct pieces where `size` divides the piece."""
    if (
        not isinstance(prompts, Prompts)
        or prompts.piece % size
        or prompts.piece // size > _MOST_PER_PIECE
    ):
        return blockkey.prompt_blocks(prompts, size, hashes)
    sums = blockkey.row_sums(prompts.rows, prompts.width, size)  # (distinct pieces, piece // size)
    counts = prompts.lengths // size
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    keys = np.empty(int(offsets[-1]), dtype=np.uint64)
    own = np.empty(len(keys) if hashes else 0, dtype=np.uint64)
    fwd, inv = blockkey.powers(int(prompts.lengths.max(initial=0)) + 1)
    base = _piece_starts(prompts, sums[:, -1], inv)
    for span in blockkey.batches(counts, _BLOCKS):
        c = counts[span.start : span.stop]
        n = int(c.sum())
        if not n:
            continue
        nth = blockkey.within(c)  # the block's index in its prompt
        end = (nth + 1) * size  # in tokens
        piece = (end - 1) // prompts.piece  # its piece's index in its prompt
        flat = np.repeat(prompts.offsets[span.start : span.stop], c) + piece
        column = (end - piece * prompts.piece) // size - 1
        with np.errstate(over="ignore"):
            got = base[flat] + inv[piece * prompts.piece] * sums[prompts.seq[flat], column]
            got *= fwd[end - 1]
            keys[offsets[span.start] : offsets[span.stop]] = got
        if hashes:
            parent = np.concatenate([np.zeros(1, dtype=np.uint64), got[:-1]])
            parent[nth == 0] = 0
            own[offsets[span.start] : offsets[span.stop]] = blockkey.unchain(got, parent, size)
    return keys, own, offsets


_BLOCKS = 1 << 20  # blocks keyed at once


def _piece_starts(prompts: Prompts, whole: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Per piece held (prompts.seq), the cumsum G of its prompt at the piece's start: the
    whole sums of the pieces before it in the prompt, each scaled by B^-(its start)."""
    counts = np.diff(prompts.offsets)
    nth = blockkey.within(counts)
    with np.errstate(over="ignore"):
        part = inv[nth * prompts.piece] * whole[prompts.seq]
        before = np.cumsum(part, dtype=np.uint64) - part  # over every prompt, then less
        at_start = np.append(before, np.uint64(0))[prompts.offsets[:-1]]  # its prompt's start
        return before - np.repeat(at_start, counts)
