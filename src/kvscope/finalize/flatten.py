"""Prompts addressed inside the flat arrays they are views of, to gather their tokens at once.

records.tokens.load_tokens gives each prompt's ids as a view of a few large flat arrays. A
pass that reads tokens at many (prompt, position) places (finalize.lcp's sort, the divergence
pairs) gathers them with one numpy index per flat array instead of slicing prompt by prompt
(~1 us of Python per slice: over a second per 100k prompts). A prompt that is not such a view
(a list, a strided array) is its own flat array.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAD = -1  # gathered past a prompt's end: below every token id


def _root(a: np.ndarray) -> np.ndarray:
    """The outermost ndarray `a` is a view of (itself when it owns its data)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@dataclass(frozen=True)
class Flat:
    """Each prompt as (flat array, start): prompt i is flats[which[i]][start[i] : start[i] + n]."""

    flats: list[np.ndarray]
    which: np.ndarray  # int64, per prompt
    start: np.ndarray  # int64, per prompt

    @classmethod
    def of(cls, prompts: Sequence[np.ndarray]) -> "Flat":
        flats: list[np.ndarray] = []
        seen: dict[int, tuple[int, int]] = {}  # id of a flat array -> (its index, its address)
        which = np.empty(len(prompts), dtype=np.int64)
        start = np.zeros(len(prompts), dtype=np.int64)
        for i, p in enumerate(prompts):
            root = _root(p)
            if not (
                p.ndim == root.ndim == 1 and p.dtype == root.dtype
                and p.flags.c_contiguous and root.flags.c_contiguous
            ):  # fmt: skip
                which[i] = len(flats)  # its own flat array, from its start
                flats.append(np.ascontiguousarray(p).ravel())
                continue
            known = seen.get(id(root))
            if known is None:
                known = seen[id(root)] = (len(flats), root.ctypes.data)
                flats.append(root)
            which[i] = known[0]
            start[i] = (p.ctypes.data - known[1]) // p.itemsize
        return cls(flats, which, start)

    def gather(
        self, prompt: np.ndarray, begin: np.ndarray, end: np.ndarray, width: int
    ) -> np.ndarray:
        """(len(prompt), width) int64: tokens begin .. begin + width of each prompt's span,
        PAD at and past `end` (a span's end, at most its prompt's length)."""
        out = np.full((len(prompt), width), PAD, dtype=np.int64)
        cols = np.arange(width)
        flat_of = self.which[prompt]
        by_flat = np.argsort(flat_of, kind="stable")
        bounds = np.flatnonzero(np.diff(flat_of[by_flat])) + 1
        for rows in np.split(by_flat, bounds) if len(prompt) else ():
            flat = self.flats[int(flat_of[rows[0]])]
            b = begin[rows]
            valid = b[:, None] + cols < end[rows][:, None]
            at = np.minimum((self.start[prompt[rows]] + b)[:, None] + cols, max(len(flat) - 1, 0))
            # int64 before PAD joins them: uint16 ids (load_tokens) would wrap it to 65535
            got = flat[at].astype(np.int64) if len(flat) else PAD
            out[rows] = np.where(valid, got, PAD)
        return out
