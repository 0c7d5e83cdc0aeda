"""A JSONL trace read a chunk at a time (sim/inputs/chunks.py): every plain list is read a chunk
at once, with its line's number; a chunk with any other form is parsed line by line. Each test
runs with both readers of a chunk's lists: numpy's and the compiled one."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvscope.errors import KvscopeError
from kvscope.sim.inputs import chunks
from kvscope.sim.inputs.sources import Source, load_source
from kvscope.sim.trace import LineNames


@pytest.fixture(autouse=True, params=[False, True], ids=["numpy", "compiled"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(chunks, "kernel_for", lambda _path: request.param)
    return bool(request.param)


ROWS = [
    {"timestamp": i, "input_length": 4 * len(ids), "output_length": 1, "hash_ids": ids}
    for i, ids in enumerate([[1, 2, 3], [], [4], [(1 << 64) - 2, 0, 17], [5, 6]])
]


def _write(path: Path, rows: list, seps: tuple[str, str], blank: bool = False) -> Path:
    text = [json.dumps(r, separators=seps) + ("\r\n\n   \n" if blank else "\n") for r in rows]
    path.write_text("".join(text))
    return path


@pytest.mark.parametrize("seps", [(",", ":"), (", ", ": ")])
@pytest.mark.parametrize("chunk_bytes", [1, 90, 1 << 20])
@pytest.mark.parametrize("blank", [False, True])
def test_plain_lists_are_read_a_chunk_at_once_with_their_line_numbers(
    tmp_path: Path,
    seps: tuple[str, str],
    chunk_bytes: int,
    blank: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk_bytes)
    path = _write(tmp_path / "m.jsonl", ROWS, seps, blank)
    read = list(chunks.read(path, "hash_ids", np.uint64))
    assert all(c.ids is not None and c.counts is not None for c in read)
    assert sum(len(c) for c in read) == len(ROWS)
    ids = np.concatenate([c.ids for c in read if c.ids is not None])
    assert ids.dtype == np.uint64 and ids.tolist() == [i for r in ROWS for i in r["hash_ids"]]
    counts = [n for c in read if c.counts is not None for n in c.counts.tolist()]
    assert counts == [len(r["hash_ids"]) for r in ROWS]
    numbers = [n for c in read for n in c.numbers]
    assert numbers == [1 + 3 * i for i in range(5)] if blank else [1, 2, 3, 4, 5]
    rows = [r for c in read for r in c.rows]
    assert [r["hash_ids"] for r in rows] == [[]] * 5
    assert [r["timestamp"] for r in rows] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        (b"[1 2]", None),  # not JSON: numbers without a comma between them
        (b"[1,,2]", None),
        (b"[1,2,]", None),
        (b"[,1]", None),
        (b"[1.5]", [1.5]),
        (b"[-1]", [-1]),
        (b"[18446744073709551615]", [(1 << 64) - 1]),  # numpy's parse saturates there
        (b"[18446744073709551616]", [float(1 << 64)]),  # beyond 64 bits: orjson's float
        (b"[1,\t2]", [1, 2]),
        (b"[true]", [True]),
    ],
)
@pytest.mark.parametrize(("lift", "dtype"), [("hash_ids", np.uint64), ("token_ids", np.int64)])
def test_a_list_numpy_cannot_read_exactly_sends_its_chunk_line_by_line(
    tmp_path: Path, text: bytes, ids: list | None, lift: str, dtype: type, kernel: bool
) -> None:
    good = b'{"timestamp":0,"input_length":8,"output_length":1,"%s":[1,2]}\n' % lift.encode()
    path = tmp_path / "m.jsonl"
    path.write_bytes(good + good.replace(b"[1,2]", text) + good)
    if ids is None:
        with pytest.raises(KvscopeError, match=rf"^{path}:2: not JSON"):
            list(chunks.read(path, lift, dtype))
        return
    (chunk,) = chunks.read(path, lift, dtype)
    assert list(chunk.numbers) == [1, 2, 3]
    if kernel and dtype == np.uint64 and ids == [(1 << 64) - 1]:  # no saturation: read at once
        assert chunk.ids is not None and chunk.ids.tolist() == [1, 2, *ids, 1, 2]
        return
    assert chunk.ids is None
    assert [list(r[lift]) for r in chunk.rows] == [[1, 2], ids, [1, 2]]


@pytest.mark.parametrize("empty", [False, True])
def test_token_lists_are_read_a_chunk_at_once(tmp_path: Path, empty: bool) -> None:
    """Signed ids (token ids) are counted by an end after each list, or, where a list is
    empty, by its commas: either way each line gets its own."""
    lists = [[5, 0, 17], [9223372036854775806], [1] * 40, [], [3, 3]]
    if not empty:
        lists[3] = [8]
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(json.dumps({"request_id": i, "token_ids": t}) + "\n" for i, t in enumerate(lists))
    )
    (chunk,) = chunks.read(path, "token_ids", np.int64)
    assert chunk.ids is not None and chunk.counts is not None
    assert chunk.ids.tolist() == [i for t in lists for i in t]
    assert chunk.counts.tolist() == [len(t) for t in lists]


@pytest.mark.parametrize("top", [7, (1 << 63) - 1, 1 << 63, (1 << 64) - 2])
def test_hash_ids_of_either_half_of_uint64_are_read_exactly(tmp_path: Path, top: int) -> None:
    """Unsigned ids (hash ids: small counters or 64-bit hashes) are read exactly on both sides
    of 2**63, each line with its own count."""
    lists = [[5, 0, 17], [top], [1] * 40, [3, top, 3]]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "hash_ids": t}) + "\n"
                            for i, t in enumerate(lists)))  # fmt: skip
    (chunk,) = chunks.read(path, "hash_ids", np.uint64)
    assert chunk.ids is not None and chunk.counts is not None and chunk.ids.dtype == np.uint64
    assert chunk.ids.tolist() == [i for t in lists for i in t]
    assert chunk.counts.tolist() == [len(t) for t in lists]


@pytest.mark.parametrize("chunk_bytes", [1, 200, 1 << 20])
def test_a_bad_line_is_named_whichever_chunk_it_is_in(
    tmp_path: Path, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk_bytes)
    rows = [dict(r) for r in ROWS * 4]
    rows[13]["output_length"] = -3  # line 14, read in a chunk that is all plain lists
    path = _write(tmp_path / "m.jsonl", rows, (",", ":"))
    with pytest.raises(KvscopeError) as err:
        load_source(path, block_size=4)
    assert str(err.value) == f"{path}:14: field 'output_length' is negative (-3)"


@pytest.mark.parametrize("chunk_bytes", [1, 200, 1 << 20])
def test_a_line_broken_around_a_plain_list_is_named(
    tmp_path: Path, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk_bytes)
    lines = [json.dumps(r, separators=(",", ":")) for r in ROWS * 3]
    lines[8] = lines[8][:-1]  # line 9 without its closing brace; its list is plain
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(KvscopeError, match=rf"^{path}:9: not JSON"):
        list(chunks.read(path, "hash_ids", np.uint64))


@pytest.mark.parametrize(
    ("line", "rid"),
    [
        (b'{"request_id":"r\\"token_ids","token_ids":[1,2,3,4],"agent":"a"}', 'r"token_ids'),
        (b'{"request_id":"s","x\\"token_ids":[9],"token_ids":[1,2,3,4],"agent":"a"}', "s"),
    ],
)
def test_a_field_named_like_the_list_is_not_taken_for_it(
    tmp_path: Path, line: bytes, rid: str
) -> None:
    """A string or another key ending in the list's name, before the list: not the list."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(line + b"\n" + line + b"\n")
    trace = load_source(path, block_size=2).trace
    assert trace.request_ids == (rid, rid) and trace.agents == ("a", "a")
    assert trace.prompt_tokens.tolist() == [4, 4] and len(set(trace.keys.tolist())) == 2


@pytest.mark.parametrize("chunk_bytes", [1, 120, 1 << 20])
def test_a_token_line_without_a_timestamp_starts_at_its_position_in_the_file(
    tmp_path: Path, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk_bytes)
    rows = [{"request_id": f"r{i}", "token_ids": [i, 1, 2, 3]} for i in range(9)]
    rows[4]["timestamp"] = 4.5
    path = _write(tmp_path / "t.jsonl", rows, (",", ":"))
    source = load_source(path, block_size=2)
    assert source.trace.start_s.tolist() == [i / 1e3 for i in (0, 1, 2, 3, 4.5, 5, 6, 7, 8)]
    assert source.notes == ["9 requests without output_length: replayed with 0"]


def _same(a: Source, b: Source) -> None:  # two loaded Sources replay the same requests
    assert a.kind == b.kind
    assert a.trace.request_ids == b.trace.request_ids
    np.testing.assert_array_equal(a.trace.keys, b.trace.keys)
    np.testing.assert_array_equal(a.trace.offsets, b.trace.offsets)
    np.testing.assert_array_equal(a.trace.start_s, b.trace.start_s)


@pytest.mark.parametrize("module", ["gzip", "bz2", "lzma"])
@pytest.mark.parametrize("chunk_bytes", [90, 1 << 20])
def test_a_compressed_trace_reads_as_its_plain_text_does_whatever_its_name(
    tmp_path: Path, module: str, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk_bytes)
    plain = _write(tmp_path / "m.jsonl", ROWS, (",", ":"))
    packed = tmp_path / "packed.jsonl"  # no .gz: told by its bytes
    packed.write_bytes(importlib.import_module(module).compress(plain.read_bytes()))
    _same(load_source(packed, 4), load_source(plain, 4))


def test_a_byte_order_mark_before_the_first_line_is_skipped(tmp_path: Path) -> None:
    plain = _write(tmp_path / "m.jsonl", ROWS, (",", ":"))
    marked = tmp_path / "bom.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    _same(load_source(marked, 4), load_source(plain, 4))


def test_a_torn_or_zstd_compressed_file_is_refused_with_where(tmp_path: Path) -> None:
    import gzip

    rows = [ROWS[0] | {"timestamp": i} for i in range(3000)]
    packed = gzip.compress(_write(tmp_path / "m.jsonl", rows, (",", ":")).read_bytes())
    torn = tmp_path / "torn.jsonl.gz"
    torn.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(KvscopeError, match=r"torn.jsonl.gz: cannot be read on from line \d+ "):
        load_source(torn, 4)
    zstd = tmp_path / "t.jsonl.zst"
    zstd.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 16)
    with pytest.raises(KvscopeError, match=r"zstd-compressed.*decompress it first"):
        load_source(zstd, 4)


@pytest.mark.parametrize("chunk_bytes", [1, 100, 1 << 20])
@pytest.mark.parametrize("named", [None, 3])
def test_mooncake_lines_without_ids_are_named_by_their_line(
    tmp_path: Path, chunk_bytes: int, named: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Mooncake trace that names no request gives "line-N" ids (made when read, not kept as
    strings), in start order; one named request anywhere keeps every id a string."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk_bytes)
    starts = [5, 1, 3, 2, 4]
    rows: list[dict[str, Any]] = [
        {"timestamp": t, "input_length": 4, "output_length": 1, "hash_ids": [1, 10 + i]}
        for i, t in enumerate(starts)
    ]
    if named is not None:
        rows[named]["request_id"] = "mine"
    path = _write(tmp_path / "m.jsonl", rows, (",", ":"))
    ids = load_source(path, block_size=2).trace.request_ids
    expected = [f"line-{i + 1}" for i in sorted(range(5), key=lambda i: starts[i])]
    if named is not None:
        expected[expected.index(f"line-{named + 1}")] = "mine"
    assert ids == tuple(expected) and list(ids) == expected and ids[1] == expected[1]
    assert isinstance(ids, LineNames) is (named is None)
    assert list(ids[1:3]) == expected[1:3] and ids.index(expected[2]) == 2


@pytest.mark.parametrize("packed", [False, True])
def test_a_watcher_is_told_every_byte_of_the_text_read(
    tmp_path: Path, packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a progress bar follows (chunks.watching): the text's bytes, chunk by chunk; a
    compressed file's text decompressed."""
    import gzip

    monkeypatch.setattr(chunks, "CHUNK_BYTES", 64)
    plain = _write(tmp_path / "m.jsonl", ROWS * 3, (",", ":"))
    text = plain.read_bytes()
    path = plain
    if packed:
        path = tmp_path / "m.jsonl.gz"
        path.write_bytes(gzip.compress(text))
    told: list[int] = []
    with chunks.watching(told.append):
        read = list(chunks.read(path, "hash_ids", np.uint64))
    assert sum(told) == len(text) and len(told) > 1
    assert sum(len(c) for c in read) == len(ROWS) * 3
    list(chunks.read(path, "hash_ids", np.uint64))  # outside it, nobody is told
    assert sum(told) == len(text)


@pytest.mark.parametrize(
    "line",
    [
        b'{"meta":{"token_ids":[7,8]},"token_ids":[],"request_id":"a"}',
        b'{"meta": {"token_ids": [7, 8]}, "token_ids": [], "request_id": "a"}',
        b'{"token_ids": [], "meta": {"token_ids":[7,8]}, "request_id": "a"}',
    ],
)
def test_a_nested_field_of_the_lists_name_is_not_taken_for_an_empty_list(
    tmp_path: Path, line: bytes
) -> None:
    """Emptying the first list of that name and finding the top-level field empty proves
    nothing where the field's own list is empty: the name must be in the line once."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(line + b"\n" + line + b"\n")
    for chunk in chunks.read(path, "token_ids", np.int64):
        counts = chunk.counts.tolist() if chunk.counts is not None else [None] * len(chunk)
        for row, count in zip(chunk.rows, counts, strict=True):
            assert row["meta"] == {"token_ids": [7, 8]}
            assert count in (0, None) and list(row["token_ids"]) == []
