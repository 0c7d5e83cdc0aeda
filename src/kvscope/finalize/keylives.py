"""The lives of one prefix key, for the two questions provenance asks at a request's time t.

- resident(t): the life in the cache at t, the latest stored (in ledger order) whose
  stored_ns <= t and that was not removed by t; None when there is none.
- evicted_before(t): the last life stored by t, when at least one was and every such life was
  removed by t; else None.

Both are what a scan over all the key's lives gives (the definitions), but in O(log n) where the
lives' stored_ns do not decrease in ledger order (a ledger built from events in publish order):
the lives stored by t are then a prefix, and a prefix maximum of the removal times says whether
all of them were removed. Where they are out of order, the scan itself is used. A key stored and
evicted over and over (a small cache under a shared prefix) no longer costs each request a scan
of its whole history.
"""

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Generic, Protocol, TypeVar

import numpy as np

_NEVER = float("inf")


class Life(Protocol):
    stored_ns: int
    removed_ns: int | None


L = TypeVar("L", bound=Life)


class KeyLives(Generic[L]):
    """The lives of one key in ledger order; to build once the ledger is complete."""

    __slots__ = ("lives", "ordered", "removed_by", "stored")

    def __init__(self, lives: list[L]) -> None:
        self.lives = lives
        self.stored: Sequence[int] = ()
        self.removed_by: Sequence[float] = ()  # max removal time over lives[: i + 1]
        self.ordered = len(lives) > 1  # one life: the scan is as quick (and no lists are kept)
        if not self.ordered:
            return
        self.stored = [x.stored_ns for x in lives]
        self.ordered = all(a <= b for a, b in zip(self.stored, self.stored[1:], strict=False))
        latest, removed_by = -_NEVER, []
        for x in lives:
            latest = max(latest, _NEVER if x.removed_ns is None else x.removed_ns)
            removed_by.append(latest)
        self.removed_by = removed_by

    def resident(self, t: int) -> L | None:
        if not self.ordered:
            return next((x for x in reversed(self.lives) if _alive(x, t)), None)
        k = bisect_right(self.stored, t)
        if k == 0 or self.removed_by[k - 1] <= t:
            return None
        return next(x for x in reversed(self.lives[:k]) if _alive(x, t))

    def evicted_before(self, t: int) -> L | None:
        if not self.ordered:
            before = [x for x in self.lives if x.stored_ns <= t]
            gone = all(x.removed_ns is not None and x.removed_ns <= t for x in before)
            return before[-1] if before and gone else None
        k = bisect_right(self.stored, t)
        return self.lives[k - 1] if k and self.removed_by[k - 1] <= t else None


def _alive(x: Life, t: int) -> bool:
    return x.stored_ns <= t and (x.removed_ns is None or x.removed_ns > t)


def by_key(lives: Iterable[tuple[int, L]]) -> dict[int, KeyLives[L]]:
    """(key, life) pairs in ledger order -> each key's KeyLives."""
    grouped: dict[int, list[L]] = {}
    for key, life in lives:
        grouped.setdefault(key, []).append(life)
    return {key: KeyLives(group) for key, group in grouped.items()}


NEVER = np.iinfo(np.int64).max  # KeyIndex: the removal time of a life never removed


class KeyIndex:
    """Every key's lives as flat arrays, answering KeyLives' two questions for many queries at once.

    `keys` (uint64), `stored` and `removed` (int64, NEVER for a life never removed) hold one
    entry per life in ledger order. `query` gives, per (key, t), the index of the life that
    KeyLives.resident(t) or .evicted_before(t) would return for the key's lives, -1 for None:
    the same answers (the definitions in the module docstring), without a Python object per key
    or life. Keys whose lives are stored in order are answered in numpy (a binary search among
    the key's lives, a prefix maximum of removal times); the rest (a key stored out of order, or
    a resident life that is not the latest stored) by the scan, one query at a time.
    """

    def __init__(self, keys: np.ndarray, stored: np.ndarray, removed: np.ndarray) -> None:
        self.perm = np.argsort(keys, kind="stable")  # by key, ledger order within a key
        self.keys, self.stored = keys[self.perm], stored[self.perm]
        self.removed = removed[self.perm]
        same = self.keys[1:] == self.keys[:-1]
        out_of_order = same & (self.stored[1:] < self.stored[:-1])
        self.disorder = np.zeros(len(keys), dtype=np.int64)  # out-of-order pairs before i
        np.cumsum(out_of_order, out=self.disorder[1:])
        # the removal times' running maximum within each key (a key's lives: one run of `group`)
        group = np.zeros(len(keys), dtype=np.int64)
        np.cumsum(~same, out=group[1:])
        uniq, rank = np.unique(self.removed, return_inverse=True)
        stride = np.int64(len(uniq))
        running = np.maximum.accumulate(group * stride + rank.ravel())  # a later key: larger
        self.removed_by = uniq[running - group * stride]

    def query(self, keys: np.ndarray, t: np.ndarray, resident: np.ndarray) -> np.ndarray:
        """Per query i: resident(t[i]) of key keys[i] where resident[i], else evicted_before(t[i]);
        as an index into the arrays given at construction, -1 where the answer is None."""
        lo = np.searchsorted(self.keys, keys, side="left")
        hi = np.searchsorted(self.keys, keys, side="right")
        out = np.full(len(keys), -1, dtype=np.int64)
        found = np.flatnonzero(hi > lo)
        in_order = self.disorder[hi[found] - 1] == self.disorder[lo[found]]
        fast, scan = found[in_order], found[~in_order]
        a, b, tf = lo[fast], hi[fast], t[fast]
        while True:  # a: the first life of the key stored after t (stored_ns ascending here)
            active = np.flatnonzero(a < b)
            if not len(active):
                break
            mid = (a[active] + b[active]) // 2
            after = self.stored[mid] > tf[active]
            b[active[after]] = mid[after]
            a[active[~after]] = mid[~after] + 1
        last = np.maximum(a - 1, 0)  # the latest life stored by t, where a > lo (some is)
        some = a > lo[fast]
        gone = self.removed_by[last] <= tf  # every life stored by t was removed by t
        latest_alive = self.removed[last] > tf
        want = resident[fast]
        out[fast] = np.where(some & np.where(want, latest_alive, gone), last, -1)
        # resident, but not the latest stored (it was removed by t): scan back from it
        back = some & want & ~gone & ~latest_alive
        for i, end in zip(fast[back].tolist(), last[back].tolist(), strict=True):
            out[i] = self._scan_resident(int(lo[i]), end, int(t[i]))
        for i in scan.tolist():
            lo_i, hi_i, t_i = int(lo[i]), int(hi[i]), int(t[i])
            if resident[i]:
                out[i] = self._scan_resident(lo_i, hi_i, t_i)
            else:
                out[i] = self._scan_evicted(lo_i, hi_i, t_i)
        hit = out >= 0
        out[hit] = self.perm[out[hit]]
        return out

    def _scan_resident(self, lo: int, hi: int, t: int) -> int:
        """The last of lives [lo, hi) alive at t, -1 if none."""
        for m in range(hi - 1, lo - 1, -1):
            if self.stored[m] <= t < self.removed[m]:
                return m
        return -1

    def _scan_evicted(self, lo: int, hi: int, t: int) -> int:
        """The last of lives [lo, hi) stored by t when every such life was removed by t, else -1."""
        before = [m for m in range(lo, hi) if self.stored[m] <= t]
        if before and all(self.removed[m] <= t for m in before):
            return before[-1]
        return -1
