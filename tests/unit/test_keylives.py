"""finalize.keylives: the lookups give what a scan over all of a key's lives gives."""

import random
from dataclasses import dataclass

from kvscope.finalize.keylives import KeyLives, by_key


@dataclass
class Life:
    stored_ns: int
    removed_ns: int | None


def scan_resident(lives: list[Life], t: int) -> Life | None:
    alive = [x for x in lives if x.stored_ns <= t and (x.removed_ns is None or x.removed_ns > t)]
    return alive[-1] if alive else None


def scan_evicted(lives: list[Life], t: int) -> Life | None:
    before = [x for x in lives if x.stored_ns <= t]
    gone = all(x.removed_ns is not None and x.removed_ns <= t for x in before)
    return before[-1] if before and gone else None


def test_known_answers() -> None:
    a, b, c = Life(0, 10), Life(10, 20), Life(30, None)
    lives = KeyLives([a, b, c])
    assert [lives.resident(t) for t in (-1, 5, 10, 25, 30)] == [None, a, b, None, c]
    assert [lives.evicted_before(t) for t in (-1, 5, 20, 25, 40)] == [None, None, b, b, None]


def test_same_as_a_scan_in_and_out_of_order() -> None:
    r = random.Random(5)
    for _ in range(500):
        lives, t = [], 0
        for _ in range(r.randrange(6)):
            t += r.randrange(-3 if r.random() < 0.3 else 0, 6)
            lives.append(Life(t, r.choice([None, t + r.randrange(0, 8)])))
        index = by_key([(1, x) for x in lives]).get(1, KeyLives([]))
        for q in range(-2, t + 10):
            assert index.resident(q) is scan_resident(lives, q)
            assert index.evicted_before(q) is scan_evicted(lives, q)
