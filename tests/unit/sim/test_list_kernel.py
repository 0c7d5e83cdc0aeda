"""The compiled reader of a chunk's id lists (sim/inputs/list_kernel.py) finds each line's list
where the line has it and reads what orjson reads, as numpy's reader does; it refuses every line
that is not a plain list of integers of its dtype."""

import json

import numpy as np
import orjson
import pytest

from kvscope.sim.inputs import chunks
from kvscope.sim.inputs.list_kernel import SPAN, find_lists

KEY = b'"token_ids"'


def _lists(rng: np.random.Generator, top: int) -> list[list[int]]:
    """Lists of random lengths (some empty) of ids up to `top`, small and large mixed."""
    out = []
    for _ in range(int(rng.integers(1, 40))):
        n = int(rng.choice([0, 1, 2, 7, 300]))
        big = rng.integers(0, top, size=n, dtype=np.uint64, endpoint=True).tolist()
        small = rng.integers(0, 50_000, size=n).tolist()
        out.append([b if k % 3 else s for k, (b, s) in enumerate(zip(big, small, strict=True))])
    return out


def _line(ids: list[int], i: int, seps: tuple[str, str], first: bool) -> bytes:
    """A JSON object with the list first or after other fields (a string with brackets,
    commas and digits among them)."""
    row = {"token_ids": ids} if first else {}
    row |= {"request_id": f"r[{i}],7", "timestamp": i * 0.5}
    row |= {} if first else {"token_ids": ids, "output_length": 3}
    return json.dumps(row, separators=seps).encode()


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
@pytest.mark.parametrize("seps", [(",", ":"), (", ", ": "), (" , ", " : ")])
@pytest.mark.parametrize("seed", range(4))
def test_plain_lists_are_found_and_read_as_orjson_reads_them(
    dtype: type, seps: tuple[str, str], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    top = int(np.iinfo(dtype).max)
    lists = [*_lists(rng, top), [top, 0]]  # the largest id there is, exactly
    blank = {int(b) for b in rng.integers(0, len(lists), size=3)}
    lines = []
    for i, ids in enumerate(lists):
        lines += [b"", b" \t\r"] if i in blank else []
        lines.append(_line(ids, i, seps, bool(i % 2)))
    text = b"\n".join(lines) + b"\n"
    found = find_lists(text, KEY, dtype)
    assert found is not None
    spans, ids, counts, size = found
    assert size == len(lines) and len(spans) == len(lists)
    assert ids.dtype == dtype and counts.tolist() == [len(x) for x in lists]
    assert ids.tolist() == [i for x in lists for i in x]
    for (line, start, open_, close, end), row in zip(spans.tolist(), lists, strict=True):
        assert text[start:end] == lines[line]
        assert text[open_ : open_ + 1] == b"[" and text[close : close + 1] == b"]"
        rest = orjson.loads(text[start : open_ + 1] + text[close:end])
        assert rest["token_ids"] == [] and orjson.loads(text[start:end])["token_ids"] == row
    assert len(SPAN) == spans.shape[1]


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_the_same_ids_as_numpys_reader(dtype: type) -> None:
    lists = _lists(np.random.default_rng(7), int(np.iinfo(dtype).max) - 1)
    texts = [orjson.dumps(x)[1:-1] for x in lists]
    text = b"".join(b'{"token_ids":[' + t + b"]}\n" for t in texts)
    found, by_numpy = find_lists(text, KEY, dtype), chunks._ids(texts, dtype)
    assert found is not None and by_numpy is not None
    assert found[1].tolist() == by_numpy[0].tolist()
    assert found[2].tolist() == by_numpy[1].tolist()


@pytest.mark.parametrize(
    "line",
    [
        b'{"token_ids":[1 2]}',  # no comma between
        b'{"token_ids":[1,,2]}',
        b'{"token_ids":[1,2,]}',
        b'{"token_ids":[,1]}',
        b'{"token_ids":[,]}',
        b'{"token_ids":[1.5]}',
        b'{"token_ids":[1e3]}',
        b'{"token_ids":[-1]}',
        b'{"token_ids":[+1]}',
        b'{"token_ids":[true]}',
        b'{"token_ids":["1"]}',
        b'{"token_ids":[1,\t2]}',
        b'{"token_ids":[[1]]}',
        b'{"token_ids":[1',  # no end: the list runs to the line's end
        b'{"token_ids":[18446744073709551616]}',  # beyond 64 bits
        b'{"token_ids":[99999999999999999999999]}',
        b'{"token_ids":null}',
        b'{"token_ids"  [1]}',  # no colon
        b'{"ids":[1]}',  # no such key
        b'{"a":"token_ids","token_ids":[1]}',  # the first "token_ids" is no key
        b"[1]",
    ],
)
@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_a_line_that_is_not_a_plain_list_is_left_to_another_reader(
    line: bytes, dtype: type
) -> None:
    good = b'{"token_ids":[1,2]}\n'
    assert find_lists(good + line + b"\n" + good, KEY, dtype) is None
    assert find_lists(good + good, KEY, dtype) is not None  # the lines around it are plain


def test_an_id_beyond_the_signed_maximum_is_no_token_id_but_a_hash_id() -> None:
    text = b'{"token_ids":[9223372036854775808]}\n'  # 2**63
    assert find_lists(text, KEY, np.int64) is None
    found = find_lists(text, KEY, np.uint64)
    assert found is not None and found[1].tolist() == [1 << 63]


def test_blank_lines_are_counted_but_not_read() -> None:
    text = b'\n  \n{"token_ids":[ ]}\n\t\n{"token_ids": [ 4 ]}\n'
    found = find_lists(text, KEY, np.int64)
    assert found is not None
    spans, ids, counts, size = found
    assert size == 5 and spans[:, 0].tolist() == [2, 4]
    assert ids.tolist() == [4] and counts.tolist() == [0, 1]


def test_text_must_end_with_a_newline() -> None:
    with pytest.raises(ValueError, match="newline"):
        find_lists(b'{"token_ids":[1]}', KEY, np.int64)
