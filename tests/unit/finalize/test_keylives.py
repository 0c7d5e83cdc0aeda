"""finalize.keylives: the lookups give what a scan over all of a key's lives gives."""

import random
from dataclasses import dataclass

import numpy as np

from kvscope.finalize.keylives import NEVER, KeyIndex, KeyLives, by_key


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


def index_of(lives: list[tuple[int, Life]]) -> KeyIndex:
    """A KeyIndex over (key, life) pairs in ledger order."""
    return KeyIndex(
        np.array([k for k, _ in lives], dtype=np.uint64),
        np.array([x.stored_ns for _, x in lives], dtype=np.int64),
        np.array([NEVER if x.removed_ns is None else x.removed_ns for _, x in lives], np.int64),
    )


def test_key_index_known_answers() -> None:
    # key 7: lives 0 (0-10), 2 (10-20), 4 (30-); key 3: life 1 (5-8), life 3 (2-, out of order)
    lives = [(7, Life(0, 10)), (3, Life(5, 8)), (7, Life(10, 20)), (3, Life(2, None)),
             (7, Life(30, None))]  # fmt: skip
    index = index_of(lives)
    ts = [-1, 5, 10, 25, 30]
    q = index.query(np.full(5, 7, dtype=np.uint64), np.array(ts), np.ones(5, dtype=bool))
    assert q.tolist() == [-1, 0, 2, -1, 4]
    q = index.query(np.full(5, 7, dtype=np.uint64), np.array(ts), np.zeros(5, dtype=bool))
    assert q.tolist() == [-1, -1, -1, 2, -1]
    q = index.query(np.array([3, 3, 3, 9], dtype=np.uint64), np.array([1, 6, 9, 9]),
                    np.array([True, True, True, False]))  # fmt: skip
    assert q.tolist() == [-1, 3, 3, -1]  # life 3 was stored at 2, after life 1 in the ledger
    assert KeyIndex(*(np.zeros(0, dtype=d) for d in (np.uint64, np.int64, np.int64))).query(
        np.array([1], dtype=np.uint64), np.array([0]), np.array([True])
    ).tolist() == [-1]


def test_key_index_same_as_a_scan_in_and_out_of_order() -> None:
    r = random.Random(11)
    for _ in range(300):
        lives: list[tuple[int, Life]] = []
        t = 0
        for _ in range(r.randrange(12)):
            t += r.randrange(-3 if r.random() < 0.2 else 0, 6)
            removed = r.choice([None, t + r.randrange(0, 8), t + r.randrange(0, 30)])
            lives.append((r.randrange(3), Life(t, removed)))
        index = index_of(lives)
        queries = [(k, q, want) for k in range(4) for q in range(-2, t + 35) for want in (0, 1)]
        keys, ts, wants = (np.array(c) for c in zip(*queries, strict=True))
        got = index.query(keys.astype(np.uint64), ts, wants.astype(bool)).tolist()
        for (k, q, want), g in zip(queries, got, strict=True):
            mine = [x for key, x in lives if key == k]
            expect = (scan_resident if want else scan_evicted)(mine, q)
            assert (None if g < 0 else lives[g][1]) is expect
