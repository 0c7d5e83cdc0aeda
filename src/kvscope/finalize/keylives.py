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
