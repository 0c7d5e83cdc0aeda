"""finalize.lcp (piece ranks from hashes, on arrays) against the reference PrefixIndex."""

import random

import numpy as np

from kvscope.finalize import lcp
from kvscope.records.tokens import PrefixIndex


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
    ranks, offsets = lcp.piece_ranks(arrays, 3)
    assert offsets.tolist() == [0, 1, 2, 4, 5]
    # pieces: 512 | 51 | 099, 9 | 512: sorted 099 < 51 < 512 < 9
    assert ranks.tolist() == [2, 1, 0, 3, 2]
