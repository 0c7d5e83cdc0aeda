"""records/blockkey.py's prompt block keys, compiled: Horner's form of its polynomial hash.

A prompt's k-th key is h of its first (k + 1) * size tokens, h(t_0 .. t_{m-1}) =
sum_i x(t_i) * B^(m-1-i) modulo 2**64, x(t) = t * K1 + K2: one running value per prompt,
h = h * B + x(t) token by token, read at each full block's end. The same keys as
`blockkey.prompt_blocks` (its cumsum form, in numpy), in one pass over the tokens (~1-2 ns a
token against numpy's ~6); tests/unit/sim/test_chain_kernel.py holds them equal. numba is loaded
on first use; `keys_of` is used where the pool will run compiled too (rows.Hasher).
"""

from __future__ import annotations

import numpy as np

from kvscope.records.blockkey import CONSTANTS
from kvscope.sim.caches.compiled import compiled

_B, _K1, _K2 = (np.uint64(c) for c in CONSTANTS)


def keys_of(flat: np.ndarray, counts: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, keys per prompt) of the prompts laid end to end in `flat` (`counts[i]` tokens for
    the i-th; any integer dtype, an id taken modulo 2**64)."""
    if flat.dtype.kind == "u":  # read as they are (a stream's uint16 or uint32): no wider copy
        tokens = np.ascontiguousarray(flat)
    elif flat.dtype.itemsize == 8:
        tokens = np.ascontiguousarray(flat).view(np.uint64)
    else:
        tokens = flat.astype(np.int64).view(np.uint64)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    blocks = counts // size
    keys = np.empty(int(blocks.sum()), dtype=np.uint64)
    _chain(tokens, counts, np.int64(size), keys, _B, _K1, _K2)
    return keys, blocks


@compiled()
def _chain(
    tokens: np.ndarray,
    counts: np.ndarray,
    size: np.int64,
    keys: np.ndarray,
    b: np.uint64,
    k1: np.uint64,
    k2: np.uint64,
) -> None:
    """Each full block's own hash (Horner over its tokens, four blocks at a time: independent
    chains the CPU overlaps), then the keys: key = parent * B^size + own, prompt by prompt."""
    bsize = np.uint64(1)
    for _ in range(size):
        bsize *= b
    at = 0
    out = 0
    for i in range(len(counts)):
        n = counts[i]
        nb = n // size
        q = 0
        while q + 4 <= nb:
            p0 = at + q * size
            h0 = h1 = h2 = h3 = np.uint64(0)
            for j in range(size):
                h0 = h0 * b + (tokens[p0 + j] * k1 + k2)
                h1 = h1 * b + (tokens[p0 + size + j] * k1 + k2)
                h2 = h2 * b + (tokens[p0 + 2 * size + j] * k1 + k2)
                h3 = h3 * b + (tokens[p0 + 3 * size + j] * k1 + k2)
            keys[out + q] = h0
            keys[out + q + 1] = h1
            keys[out + q + 2] = h2
            keys[out + q + 3] = h3
            q += 4
        while q < nb:
            p0 = at + q * size
            h0 = np.uint64(0)
            for j in range(size):
                h0 = h0 * b + (tokens[p0 + j] * k1 + k2)
            keys[out + q] = h0
            q += 1
        parent = np.uint64(0)
        for q in range(nb):
            parent = parent * bsize + keys[out + q]
            keys[out + q] = parent
        out += nb
        at += n
