"""Where token windows first occur among Prompts, found on their distinct content.

blockhash.first_windows_of_sorted hashes every window of every prompt. On Prompts
(finalize.prompts: each distinct piece held once) most of those windows repeat: a window within
a piece is held by every prompt holding the piece, and one across two pieces by every prompt
holding the two in a row. So the windows of each distinct piece, and of each distinct pair of
consecutive pieces (the tail of the first, the head of the second), are hashed once, each
answering for the first prompt holding it: on a PEER-like run with 16-token blocks, a third of
the tokens are hashed. Where windows are as long as a piece, the pairs' tokens approach every
prompt's, and every window is hashed instead.
"""

import numpy as np

from kvscope.finalize import blockhash
from kvscope.finalize.prompts import Prompts

# the pieces' and pairs' tokens hashed against every prompt's: above this share, hashing every
# window is as fast (a pair's tokens are gathered first; at 100k PEER-like calls with 128-token
# blocks, 0.74 of them took 1.34 s against 1.29 s)
WORTH = 0.6


class _Distinct:
    """The distinct pieces as blockhash.Batches (each piece a prompt)."""

    def __init__(self, prompts: Prompts) -> None:
        self.rows, self.lengths = prompts.rows, prompts.width

    def concat(self, lo: int, hi: int) -> np.ndarray:
        rows, width = self.rows[lo:hi], self.lengths[lo:hi]
        return rows[np.arange(rows.shape[1]) < width[:, None]]


class _Junctions:
    """Pairs of pieces as blockhash.Batches: pair k is the last `k` tokens of piece a[k] (a
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
    """blockhash.first_windows_of_sorted(prompts, size, uniq): for each sorted, distinct query
    hash, the first prompt holding a window of `size` tokens with it (len(prompts): none).
    Found on the pieces and pairs unless they hold more than `worth` of the prompts' tokens."""
    n = len(prompts)
    if size > prompts.piece or not n or not len(uniq):  # a window may span three pieces
        return blockhash.first_windows_of_sorted(prompts, size, uniq)
    counts = np.diff(prompts.offsets)
    followed = np.ones(len(prompts.seq), dtype=bool)  # a piece with another after it
    followed[prompts.offsets[1:][counts > 0] - 1] = False
    at = np.flatnonzero(followed)
    pair = prompts.seq[at] * len(prompts.rows) + prompts.seq[at + 1]
    first = at[np.unique(pair, return_index=True)[1]]  # its first place: its first prompt's
    del pair, at
    hashed = int(prompts.width.sum()) + len(first) * 2 * (size - 1)
    if hashed > worth * int(prompts.lengths.sum()):  # little shared, or windows near a piece
        return blockhash.first_windows_of_sorted(prompts, size, uniq)
    holder = np.repeat(np.arange(n, dtype=np.int64), counts)  # the prompt of each piece held
    first_of = np.full(len(prompts.rows), n, dtype=np.int64)
    np.minimum.at(first_of, prompts.seq, holder)
    found = blockhash.first_windows_of_sorted(_Distinct(prompts), size, uniq, first_of, n)
    if size == 1:
        return found
    junctions = _Junctions(prompts, prompts.seq[first], prompts.seq[first + 1], size - 1)
    across = blockhash.first_windows_of_sorted(junctions, size, uniq, holder[first], n)
    return np.minimum(found, across)
