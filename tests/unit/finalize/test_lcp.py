"""finalize.lcp (piece ranks from hashes, on arrays) against the reference PrefixIndex."""

import random

import numpy as np
from oracles import PrefixIndex

from kvscope.finalize import lcp
from kvscope.finalize.prompts import Prompts
from kvscope.records.tokens import common_prefix


def test_longest_with_earlier_is_the_prefix_index() -> None:
    prompts = [[1, 2, 3, 4], [1, 5], [7, 7, 7], [1, 2, 9], [1, 2, 3, 8], [1, 2, 3, 4], [], [8]]
    assert lcp.longest_with_earlier(prompts, chunk=2) == [0, 1, 0, 2, 3, 4, 0, 0]
    r = random.Random(5)
    for _ in range(500):
        n, top = r.randrange(14), r.choice([2, 3, 50_000])
        ps = [[r.randrange(top) for _ in range(r.randrange(40))] for _ in range(n)]
        index, want = PrefixIndex(), []
        for p in ps:
            want.append(index.longest(p))
            index.add(p)
        arrays = [np.array(p, dtype=np.int32) for p in ps]
        assert lcp.longest_with_earlier(arrays, chunk=r.choice([1, 3, 16, 17, 256])) == want


def test_piece_ranks_order_pieces_by_their_tokens() -> None:
    arrays = [np.array(p, dtype=np.int32) for p in ([5, 1, 2], [5, 1], [0, 9, 9, 9], [5, 1, 2])]
    prompts = Prompts.of(arrays, 3)
    assert prompts.offsets.tolist() == [0, 1, 2, 4, 5]
    # pieces: 512 | 51 | 099, 9 | 512 (held once): sorted 099 < 51 < 512 < 9
    assert lcp.piece_ranks(prompts)[prompts.seq].tolist() == [2, 1, 0, 3, 2]


def _as_views(ps: list[list[int]], flats: int, dtype: type = np.int32) -> list[np.ndarray]:
    """The prompts as views of `flats` flat arrays, as records.tokens.load_tokens gives them."""
    out: list[np.ndarray] = []
    for part in np.array_split(np.arange(len(ps)), flats):
        base = np.array([t for i in part for t in ps[i]], dtype=dtype)
        at = 0
        for i in part.tolist():
            out.append(base[at : at + len(ps[i])])
            at += len(ps[i])
    return out


def test_pieces_on_views_of_flat_arrays_are_the_prefix_index() -> None:
    r = random.Random(11)
    for _ in range(200):
        head = [r.randrange(3) for _ in range(r.randrange(30))]
        ps = [head[: r.randrange(len(head) + 1)] + [r.randrange(3) for _ in range(r.randrange(20))]
              for _ in range(r.randrange(1, 16))]  # fmt: skip
        index, want = PrefixIndex(), []
        for p in ps:
            want.append(index.longest(p))
            index.add(p)
        arrays = _as_views(ps, r.choice([1, 2, 5]), r.choice([np.int32, np.uint16, np.int64]))
        pieces = lcp.Pieces.of(arrays, r.choice([1, 4, 16]))
        assert pieces.longest_with_earlier() == want
        a = np.array([r.randrange(len(ps)) for _ in range(20)])
        b = np.array([r.randrange(len(ps)) for _ in range(20)])
        got = pieces.common(a, b).tolist()
        assert got == [common_prefix(ps[x], ps[y]) for x, y in zip(a, b, strict=True)]
