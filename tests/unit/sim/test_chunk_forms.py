"""Valid JSONL in many forms (field orders, spacing, nested objects and strings that hold the
list's name, escapes, blank lines, CRLF, chunks that cut lines anywhere) reads, with either
reader of a chunk's lists (numpy's, the compiled one), exactly as orjson reads each line."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from kvscope.sim.inputs import chunks

TRICKY = ['r"token_ids":[1]', "token_ids", "hash_ids", '"hash_ids":[2]', "[1,2]", "ü\u2028\\",
          "a]b", '"', ",", " ", "\t", "日本"]  # fmt: skip


def _row(rng: np.random.Generator, i: int, lift: str, dtype: type) -> dict[str, Any]:
    n = int(rng.choice([0, 1, 3, 16, 200]))
    tops = [100, 50_000, 1 << 40, int(np.iinfo(dtype).max)]
    top = tops[int(rng.integers(0, len(tops)))]
    ids = rng.integers(0, top, size=n, dtype=dtype, endpoint=True)
    fields: list[tuple[str, Any]] = [
        ("request_id", f"r{i}" + str(rng.choice(TRICKY)) * int(rng.integers(0, 3))),
        ("timestamp", float(rng.random() * 1e3) if rng.random() < 0.5 else int(i)),
        ("output_length", int(rng.integers(0, 50))),
        (lift, ids.tolist()),
    ]
    if rng.random() < 0.3:
        fields.append(("meta", {lift: [7, 8], "note": str(rng.choice(TRICKY))}))
    if rng.random() < 0.2:
        fields.append(("x", 1.5e300 if rng.random() < 0.5 else [1, "token_ids", None]))
    order = rng.permutation(len(fields))
    return dict(fields[k] for k in order)


def _text(rng: np.random.Generator, row: dict[str, Any]) -> str:
    form = int(rng.integers(0, 4))
    if form == 0:
        return orjson.dumps(row).decode()
    if form == 1:
        return json.dumps(row)  # ", " and ": ", non-ASCII escaped
    if form == 2:
        return json.dumps(row, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(row, separators=(" , ", " : "))


@pytest.mark.parametrize("kernel", [False, True], ids=["numpy", "compiled"])
@pytest.mark.parametrize(("lift", "dtype"), [("token_ids", np.int64), ("hash_ids", np.uint64)])
@pytest.mark.parametrize("seed", range(6))
def test_every_form_reads_as_orjson_reads_each_line(
    tmp_path: Path,
    seed: int,
    lift: str,
    dtype: type,
    kernel: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(chunks, "kernel_for", lambda _path: kernel)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", int(rng.choice([97, 1000, 1 << 20])))
    lines, expected = [], {}
    for i in range(150):
        if rng.random() < 0.05:
            lines.append(" " * int(rng.integers(0, 3)))
        row = _row(rng, i, lift, dtype)
        lines.append(_text(rng, row))
        expected[len(lines)] = row
    end = "\r\n" if seed % 2 else "\n"
    path = tmp_path / "t.jsonl"
    path.write_bytes((end.join(lines) + (end if seed % 3 else "")).encode())
    got: dict[int, dict[str, Any]] = {}
    for chunk in chunks.read(path, lift, dtype):
        lists = (
            np.split(chunk.ids, np.cumsum(chunk.counts)[:-1])
            if chunk.ids is not None and chunk.counts is not None
            else [None] * len(chunk)
        )
        for n, row, own in zip(chunk.numbers, chunk.rows, lists, strict=True):
            if own is not None:
                assert row[lift] == []
            ids = own if own is not None else row[lift]
            got[n] = row | {lift: [int(t) for t in ids]}
    assert got == expected
