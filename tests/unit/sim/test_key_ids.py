"""Dense ids of block keys (sim/caches/key_ids.py): equal keys alike, in first-appearance order."""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.sim.caches import key_ids


@pytest.mark.parametrize(
    "keys",
    [
        np.arange(100_000, dtype=np.uint64) % 70_000,  # sequential ids, growth past 2**16 slots
        np.array([2**64 - 1, 0, 2**63, 2**64 - 1, 1, 0, 2**63 + 1], dtype=np.uint64),
        np.random.default_rng(0).integers(0, 2**63, size=50_000, dtype=np.uint64) % 999,
    ],
)
def test_key_ids_name_equal_keys_alike_in_order_of_first_appearance(keys: np.ndarray) -> None:
    key_ids._memo.clear()
    kids, n = key_ids.key_ids(keys)
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    assert n == len(uniq)
    rank = np.empty(len(uniq), dtype=np.int64)  # unique value -> its order of first appearance
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    assert kids.tolist() == rank[inverse].tolist()


def test_key_ids_are_kept_for_the_last_keys_only() -> None:
    a, b = np.array([5, 6, 5], dtype=np.uint64), np.array([7, 7], dtype=np.uint64)
    ka, _ = key_ids.key_ids(a)
    assert key_ids.key_ids(a)[0] is ka
    assert key_ids.key_ids(b)[0].tolist() == [0, 0]
    assert key_ids.key_ids(a)[0] is not ka  # b replaced it
