"""Token hashes for provenance, vectorised with numpy: block keys, block hashes, token windows.

One polynomial hash serves everything, modulo 2**64 (uint64 wraparound) with an odd base B:
h(t_0 .. t_{m-1}) = sum_i x(t_i) * B^(m-1-i), where x(t) = t * K1 + K2 spreads token ids (K1 odd,
so x is one-to-one). Then
- a block's hash is h of its `size` tokens;
- a prompt's k-th block key is h of its first (k + 1) * size tokens: the key of a block chains on
  its parent's, key = parent * B^size + h(block) (root 0), the chaining the engines hash with, so
  two prompts share their k-th key exactly when their first k + 1 blocks are token for token
  equal (up to hash collisions, about n^2 / 2^64 for n keys);
- a window (any `size` consecutive tokens, at any offset) has the hash of a block with its tokens.

Everything is computed from one exclusive cumsum over a batch of prompts laid end to end:
G[j] = sum_{i<j} x_i * B^-i, so h(tokens s .. e - 1) = (G[e] - G[s]) * B^(e-1), whatever prompt
they are in (a prompt's hashes do not depend on where it lies in the batch). Batches hold
about `BATCH_TOKENS` tokens, so memory does not grow with the run.
"""

from collections.abc import Iterator, Sequence

import numpy as np

_B = 0xD6E8FEB86659FD93  # odd: invertible modulo 2**64
_B_INV = pow(_B, -1, 1 << 64)
_K1, _K2 = 0x9E3779B97F4A7C15, 0x632BE59BD9B4E019
BATCH_TOKENS = 1 << 20

Tokens = Sequence[int] | np.ndarray


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) modulo 2**64."""
    out = np.full(n, base, dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=np.uint64)


class _Powers:
    """B^k and B^-k for k < n, grown on demand to a power of two: for batches of at most
    BATCH_TOKENS tokens (a power of two) never beyond it, 16 bytes a token (16 MiB), and
    never regrown in a run (a regrowth leaves the old arrays' memory behind)."""

    def __init__(self) -> None:
        self.fwd = self.inv = np.ones(1, dtype=np.uint64)

    def need(self, n: int) -> None:
        if n > len(self.fwd):
            n = 1 << (n - 1).bit_length()
            self.fwd, self.inv = _powers(_B, n), _powers(_B_INV, n)


_POW = _Powers()


def _cumsum(prompts: Sequence[Tokens]) -> tuple[np.ndarray, np.ndarray]:
    """(G, starts): the batch's exclusive cumsum (len total + 1) and the prompts' bounds in it."""
    starts = np.zeros(len(prompts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in prompts], out=starts[1:])
    total = int(starts[-1])
    _POW.need(total)  # B^-i for i < total; B^(e-1) for a span's end e <= total
    G = np.zeros(total + 1, dtype=np.uint64)
    if total:
        # x(t) = t * K1 + K2, then * B^-i: int64 -> uint64 keeps distinct ids distinct
        x = np.concatenate([p for p in prompts if len(p)]).astype(np.int64).view(np.uint64)
        with np.errstate(over="ignore"):
            x *= np.uint64(_K1)
            x += np.uint64(_K2)
            x *= _POW.inv[:total]
            np.cumsum(x, dtype=np.uint64, out=G[1:])
    return G, starts


def _span_hashes(G: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """h of the tokens [begin, end) of the batch, for each span."""
    with np.errstate(over="ignore"):
        return (G[end] - G[begin]) * _POW.fwd[end - 1]


def batches(prompts: Sequence[Tokens], budget: int = BATCH_TOKENS) -> Iterator[range]:
    """Consecutive index ranges of prompts holding about `budget` tokens each."""
    i, n = 0, len(prompts)
    while i < n:
        j, tokens = i, 0
        while j < n and (j == i or tokens + len(prompts[j]) <= budget):
            tokens += len(prompts[j])
            j += 1
        yield range(i, j)
        i = j


def prompt_blocks(
    prompts: Sequence[Tokens], size: int, hashes: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, hashes, offsets) of every full block of every prompt, flat: prompt i's blocks are
    [offsets[i], offsets[i + 1]). keys: the chained prefix keys; hashes: the blocks' own hashes
    (empty when not asked for: they follow from the keys, see multiplier)."""
    counts = np.array([len(p) // size for p in prompts], dtype=np.int64)
    offsets = np.zeros(len(prompts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    keys = np.empty(int(offsets[-1]), dtype=np.uint64)
    own = np.empty(len(keys) if hashes else 0, dtype=np.uint64)
    for span in batches(prompts):
        G, starts = _cumsum([prompts[i] for i in span])
        c = counts[span.start : span.stop]
        if not c.sum():
            continue
        first = np.repeat(starts[:-1], c)
        end = first + (np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c) + 1) * size
        lo, hi = offsets[span.start], offsets[span.stop]
        keys[lo:hi] = _span_hashes(G, first, end)
        if hashes:
            own[lo:hi] = _span_hashes(G, end - size, end)
    return keys, own, offsets


def piece_hashes(prompts: Sequence[Tokens], size: int) -> np.ndarray:
    """The hashes of every prompt's consecutive `size`-token pieces, the last one possibly
    shorter (its length is mixed in), flat and in order: ceil(len / size) per prompt."""
    counts = np.array([-(-len(p) // size) for p in prompts], dtype=np.int64)
    out = np.empty(int(counts.sum()), dtype=np.uint64)
    at = 0
    for span in batches(prompts):
        G, starts = _cumsum([prompts[i] for i in span])
        c = counts[span.start : span.stop]
        n = int(c.sum())
        if not n:
            continue
        begin = np.repeat(starts[:-1], c) + (np.arange(n) - np.repeat(np.cumsum(c) - c, c)) * size
        end = np.minimum(begin + size, np.repeat(starts[1:], c))
        with np.errstate(over="ignore"):
            h = _span_hashes(G, begin, end) ^ (end - begin).astype(np.uint64) * np.uint64(_K1)
        out[at : at + n] = h
        at += n
    return out


MASK = 0xFFFF_FFFF_FFFF_FFFF


def multiplier(size: int) -> int:
    """B^size: chain(parent, h, size) == (parent * multiplier(size) + h) & MASK."""
    mult = _MULT.get(size)
    if mult is None:
        mult = _MULT[size] = pow(_B, size, 1 << 64)
    return mult


def chain(parent: int, block_hash: int, size: int) -> int:
    """The key of a block of `size` tokens with hash `block_hash` whose parent's key is `parent`."""
    return (parent * multiplier(size) + block_hash) & MASK


_MULT: dict[int, int] = {}  # size -> B^size


def first_windows(prompts: Sequence[Tokens], size: int, queries: np.ndarray) -> np.ndarray:
    """For each query hash: the index of the first prompt holding a window (`size` consecutive
    tokens at any offset) with that hash; len(prompts) where none does.

    Only windows matching a query are kept (a bitmap prefilter, then an exact match), so memory
    is that of the queries and one batch, not of every window of every prompt."""
    uniq, inverse = np.unique(queries, return_inverse=True)
    return first_windows_of_sorted(prompts, size, uniq)[inverse]


def first_windows_of_sorted(prompts: Sequence[Tokens], size: int, uniq: np.ndarray) -> np.ndarray:
    """first_windows for queries that are sorted and distinct (np.unique's): one int64 each."""
    first = np.full(len(uniq), len(prompts), dtype=np.int64)
    if not len(uniq):
        return first
    # the prefilter: a bitmap over a hash's top bits, ~1/16 full (small enough to stay cached)
    bits = min(max(len(uniq).bit_length() + 4, 16), 24)
    shift = np.uint64(64 - bits)
    bitmap = np.zeros(1 << bits, dtype=bool)
    bitmap[uniq >> shift] = True
    for span in batches(prompts):
        G, starts = _cumsum([prompts[i] for i in span])
        n_win = len(G) - size  # windows by first token g: h = (G[g + size] - G[g]) B^(g + size - 1)
        if n_win <= 0:
            continue
        with np.errstate(over="ignore"):
            h = G[size:] - G[:n_win]
            h *= _POW.fwd[size - 1 : size - 1 + n_win]
        keep = bitmap[h >> shift]
        across = (starts[1:, None] - np.arange(1, size)).ravel()  # windows across a prompt's end
        keep[across[(across >= 0) & (across < n_win)]] = False
        g = np.flatnonzero(keep)
        h = h[g]
        at = np.searchsorted(uniq, h).clip(max=len(uniq) - 1)
        hit = uniq[at] == h
        which = np.searchsorted(starts, g[hit], side="right") - 1 + span.start
        np.minimum.at(first, at[hit], which)
    return first
