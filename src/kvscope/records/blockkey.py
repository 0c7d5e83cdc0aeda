"""Block keys and block hashes: what they are and how they are computed, once for kvscope.

The contract (finalize's tables and ledger, and the replay simulator's traces, all use it):
- the same token ids give the same keys, whatever module computes them and however the ids
  are held: lists, tuples or arrays of any integer dtype (an id is taken modulo 2**64, as
  int64 -> uint64 does), so a finalized run's keys and a replay's can be compared;
- a prompt's k-th block key identifies its first k + 1 full blocks of `size` tokens: two
  prompts share their k-th key exactly when those blocks are token for token equal, up to hash
  collisions (about n^2 / 2^64 for n distinct keys); a partial last block has no key;
- a key chains on its parent's like the engines' hashes: key = chain(parent, h(block), size)
  (root 0), so unchain recovers a block's own hash from its key and its parent's.

One polynomial hash serves everything, modulo 2**64 (uint64 wraparound) with an odd base B:
h(t_0 .. t_{m-1}) = sum_i x(t_i) * B^(m-1-i), where x(t) = t * K1 + K2 spreads token ids (K1 odd,
so x is one-to-one). A block's hash is h of its `size` tokens; a prompt's k-th key is h of its
first (k + 1) * size tokens, i.e. key = parent * B^size + h(block); a window (any `size`
consecutive tokens, at any offset) has the hash of a block with its tokens.

Everything is computed from one exclusive cumsum over a batch of prompts laid end to end:
G[j] = sum_{i<j} x_i * B^-i, so h(tokens s .. e - 1) = (G[e] - G[s]) * B^(e-1), whatever prompt
they are in (a prompt's hashes do not depend on where it lies in the batch). Batches hold
about `BATCH_TOKENS` tokens, so memory does not grow with the run.
"""

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

_B = 0xD6E8FEB86659FD93  # odd: invertible modulo 2**64
_B_INV = pow(_B, -1, 1 << 64)
_K1, _K2 = 0x9E3779B97F4A7C15, 0x632BE59BD9B4E019
# B, K1, K2 for an evaluation of h in another form (the replay's compiled Horner loop,
# sim/inputs/chain_kernel.py: h = h * B + x(t) token by token; a test holds it equal to these)
CONSTANTS = (_B, _K1, _K2)
BATCH_TOKENS = 1 << 20

Tokens = Sequence[int] | np.ndarray


class Batches(Protocol):
    """Prompts given as their lengths and, for a range of them, their tokens end to end
    (finalize.prompts.Prompts, which holds each distinct piece once, or a list: as_batches)."""

    @property
    def lengths(self) -> np.ndarray: ...  # int64, per prompt

    def concat(self, lo: int, hi: int) -> np.ndarray: ...  # prompts lo .. hi - 1, end to end


class _Listed:
    """A sequence of token sequences as Batches."""

    def __init__(self, prompts: Sequence[Tokens]) -> None:
        self.prompts = prompts
        self.lengths = np.array([len(p) for p in prompts], dtype=np.int64)

    def concat(self, lo: int, hi: int) -> np.ndarray:
        parts = [np.asarray(p) for p in self.prompts[lo:hi] if len(p)]
        if not parts:
            return np.zeros(0, dtype=np.int64)
        if np.result_type(*parts).kind not in "iu":  # uint64 with a signed dtype: float64
            return np.concatenate(parts, dtype=np.int64, casting="unsafe")  # ids modulo 2**64
        return np.concatenate(parts)


def as_batches(prompts: "Sequence[Tokens] | Batches") -> Batches:
    """`prompts` as Batches: itself when it is (it has `concat`), else a list's adapter."""
    return prompts if hasattr(prompts, "concat") else _Listed(prompts)  # type: ignore[arg-type,return-value]


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
_ROWS = 8192  # rows summed at once (row_sums)


def powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(B^k, B^-k) for k < n: views of the shared tables, not to be written."""
    _POW.need(n)
    return _POW.fwd[:n], _POW.inv[:n]


def row_sums(rows: np.ndarray, width: np.ndarray, every: int) -> np.ndarray:
    """(len(rows), rows.shape[1] // every) uint64: what the exclusive cumsum G (_cumsum) of a
    prompt beginning with row k's first width[k] tokens holds at its m-th `every` tokens
    (column m - 1); tokens past the width add nothing."""
    cols = rows.shape[1]
    _, inv = powers(cols)
    out = np.empty((len(rows), cols // every), dtype=np.uint64)
    for g in range(0, len(rows), _ROWS):
        with np.errstate(over="ignore"):
            x = rows[g : g + _ROWS].astype(np.int64).view(np.uint64)
            x *= np.uint64(_K1)
            x += np.uint64(_K2)
            x *= inv
            x[np.arange(cols) >= width[g : g + _ROWS, None]] = 0
            np.cumsum(x, axis=1, dtype=np.uint64, out=x)
        out[g : g + _ROWS] = x[:, every - 1 :: every]
    return out


def _cumsum(flat: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(G, starts): the exclusive cumsum (len total + 1) of prompts laid end to end in `flat`
    (their `lengths`), and the prompts' bounds in it."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    total = int(starts[-1])
    _POW.need(total)  # B^-i for i < total; B^(e-1) for a span's end e <= total
    G = np.zeros(total + 1, dtype=np.uint64)
    if total:
        # x(t) = t * K1 + K2, then * B^-i: int64 -> uint64 keeps distinct ids distinct
        x = flat.astype(np.int64).view(np.uint64)
        with np.errstate(over="ignore"):
            x *= np.uint64(_K1)
            x += np.uint64(_K2)
            x *= _POW.inv[:total]
            np.cumsum(x, dtype=np.uint64, out=G[1:])
    return G, starts


def within(counts: np.ndarray) -> np.ndarray:
    """For items laid out group after group (`counts` a group), each one's index in its group."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _batch(prompts: Batches, span: range) -> tuple[np.ndarray, np.ndarray]:
    """_cumsum of the prompts in `span`."""
    return _cumsum(prompts.concat(span.start, span.stop), prompts.lengths[span.start : span.stop])


def _span_hashes(G: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """h of the tokens [begin, end) of the batch, for each span."""
    with np.errstate(over="ignore"):
        return (G[end] - G[begin]) * _POW.fwd[end - 1]


def batches(lengths: np.ndarray, budget: int = BATCH_TOKENS) -> Iterator[range]:
    """Consecutive index ranges of prompts (their `lengths`) holding about `budget` tokens each
    (one prompt longer than that is a range of its own)."""
    ends = np.cumsum(lengths, dtype=np.int64)
    i, n = 0, len(lengths)
    while i < n:
        before = int(ends[i - 1]) if i else 0
        j = max(int(np.searchsorted(ends, before + budget, side="right")), i + 1)
        yield range(i, j)
        i = j


def prompt_blocks(
    prompts: "Sequence[Tokens] | Batches", size: int, hashes: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, hashes, offsets) of every full block of every prompt, flat: prompt i's blocks are
    [offsets[i], offsets[i + 1]). keys: the chained prefix keys; hashes: the blocks' own hashes
    (empty when not asked for: they follow from the keys, see multiplier)."""
    prompts = as_batches(prompts)
    counts = prompts.lengths // size
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    keys = np.empty(int(offsets[-1]), dtype=np.uint64)
    own = np.empty(len(keys) if hashes else 0, dtype=np.uint64)
    for span in batches(prompts.lengths):
        c = counts[span.start : span.stop]
        if not c.sum():
            continue
        G, starts = _batch(prompts, span)
        first = np.repeat(starts[:-1], c)
        end = first + (within(c) + 1) * size
        lo, hi = offsets[span.start], offsets[span.stop]
        keys[lo:hi] = _span_hashes(G, first, end)
        if hashes:
            own[lo:hi] = _span_hashes(G, end - size, end)
    return keys, own, offsets


def span_hashes(flat: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The hash of each span flat[begin[k] : end[k]] with its length mixed in (spans of one
    hash but different lengths differ), for spans in order and not overlapping, each at most
    BATCH_TOKENS long: a cumsum over BATCH_TOKENS tokens at a time."""
    out = np.empty(len(begin), dtype=np.uint64)
    g = 0
    while g < len(begin):
        lo = int(begin[g])
        h = max(int(np.searchsorted(end, lo + BATCH_TOKENS, side="right")), g + 1)
        hi = int(end[h - 1])
        G, _ = _cumsum(flat[lo:hi], np.array([hi - lo], dtype=np.int64))
        b, e = begin[g:h] - lo, end[g:h] - lo
        with np.errstate(over="ignore"):
            out[g:h] = _span_hashes(G, b, e) ^ (e - b).astype(np.uint64) * np.uint64(_K1)
        g = h
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


def unchain(keys: np.ndarray, parents: np.ndarray, size: int) -> np.ndarray:
    """The blocks' own hashes from their keys and their parents' keys (0 for a first block):
    chain undone, for uint64 arrays."""
    with np.errstate(over="ignore"):
        return keys - parents * np.uint64(multiplier(size))


_MULT: dict[int, int] = {}  # size -> B^size


def first_windows_of_sorted(
    prompts: "Sequence[Tokens] | Batches",
    size: int,
    uniq: np.ndarray,
    value: np.ndarray | None = None,
    missing: int | None = None,
) -> np.ndarray:
    """For each query hash in `uniq` (sorted and distinct: np.unique's), the index of the first
    prompt holding a window (`size` consecutive tokens at any offset, within one prompt) with
    that hash, as int64; len(prompts) where none does. With `value` (int64 per prompt), the
    least value of the prompts holding the window instead of the first's index, and `missing`
    (default len(prompts)) where none does.

    Only windows matching a query are kept (a bitmap prefilter, then an exact match), so memory
    is that of the queries and one batch, not of every window of every prompt."""
    prompts = as_batches(prompts)
    n = len(prompts.lengths)
    first = np.full(len(uniq), n if missing is None else missing, dtype=np.int64)
    if not len(uniq):
        return first
    # the prefilter: a bitmap over a hash's top bits, ~1/16 full (small enough to stay cached)
    bits = min(max(len(uniq).bit_length() + 4, 16), 24)
    shift = np.uint64(64 - bits)
    bitmap = np.zeros(1 << bits, dtype=bool)
    bitmap[uniq >> shift] = True

    def matches(span: range) -> tuple[np.ndarray, np.ndarray]:
        """(query, prompt) of each window of the batch `span` whose hash is a query's."""
        G, starts = _batch(prompts, span)
        n_win = len(G) - size  # windows by first token g: h = (G[g + size] - G[g]) B^(g + size - 1)
        if n_win <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
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
        return at[hit], np.searchsorted(starts, g[hit], side="right") - 1 + span.start

    spans = list(batches(prompts.lengths))
    _POW.need(max((int(prompts.lengths[s.start : s.stop].sum()) for s in spans), default=0))
    # two batches at a time: numpy's passes let the other thread run (the powers grown first)
    with ThreadPoolExecutor(2) as pool:
        for at, which in pool.map(matches, spans):
            np.minimum.at(first, at, which if value is None else value[which])
    return first
