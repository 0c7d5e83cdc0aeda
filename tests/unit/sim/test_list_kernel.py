"""The compiled reader of a chunk's id lists (sim/inputs/list_kernel.py) reads what orjson reads,
as numpy's reader does, and refuses every list that is not plain integers of its dtype."""

import numpy as np
import orjson
import pytest

from kvscope.sim.inputs import chunks
from kvscope.sim.inputs.list_kernel import read_lists


def _lists(rng: np.random.Generator, top: int) -> list[list[int]]:
    """Lists of random lengths (some empty) of ids below `top`, small and large mixed."""
    out = []
    for _ in range(int(rng.integers(1, 40))):
        n = int(rng.choice([0, 1, 2, 7, 300]))
        big = rng.integers(0, top, size=n, dtype=np.uint64, endpoint=True).tolist()
        small = rng.integers(0, 50_000, size=n).tolist()
        out.append([b if k % 3 else s for k, (b, s) in enumerate(zip(big, small, strict=True))])
    return out


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
@pytest.mark.parametrize("sep", [b",", b", ", b" , "])
@pytest.mark.parametrize("seed", range(5))
def test_plain_lists_read_as_orjson_reads_them(dtype: type, sep: bytes, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lists = _lists(rng, int(np.iinfo(dtype).max))
    lists.append([int(np.iinfo(dtype).max), 0])  # the largest id there is, exactly
    texts = [orjson.dumps(x)[1:-1].replace(b",", sep) for x in lists]
    read = read_lists(texts, dtype)
    assert read is not None
    ids, counts = read
    assert ids.dtype == dtype and counts.tolist() == [len(x) for x in lists]
    assert ids.tolist() == [i for x in lists for i in x]
    top = np.iinfo(dtype).max
    below = [t for t, x in zip(texts, lists, strict=True) if max(x, default=0) < top]
    by_numpy, by_kernel = chunks._ids(below, dtype), read_lists(below, dtype)
    assert by_numpy is not None and by_kernel is not None  # numpy's saturates at the maximum
    assert [a.tolist() for a in by_numpy] == [a.tolist() for a in by_kernel]


@pytest.mark.parametrize(
    "text",
    [
        b"1 2",  # no comma between
        b"1,,2",
        b"1,2,",
        b",1",
        b",",
        b"1.5",
        b"1e3",
        b"-1",
        b"+1",
        b"true",
        b'"1"',
        b"1,\t2",
        b"[1]",
        b"18446744073709551616",  # beyond 64 bits
        b"99999999999999999999999",
    ],
)
@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_a_list_that_is_not_plain_is_left_to_the_line_by_line_reader(
    text: bytes, dtype: type
) -> None:
    assert read_lists([b"1,2", text, b"3"], dtype) is None
    assert read_lists([b"1,2", b"3"], dtype) is not None  # the lists around it are plain


def test_an_id_beyond_the_signed_maximum_is_no_token_id_but_a_hash_id() -> None:
    text = [b"9223372036854775808"]  # 2**63
    assert read_lists(text, np.int64) is None
    read = read_lists(text, np.uint64)
    assert read is not None and read[0].tolist() == [1 << 63]


def test_blank_and_empty_lists_count_zero_ids() -> None:
    read = read_lists([b"", b"  ", b" 4 ", b""], np.int64)
    assert read is not None
    assert read[0].tolist() == [4] and read[1].tolist() == [0, 0, 1, 0]
