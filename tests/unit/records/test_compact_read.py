"""Reading large streams compactly: rows share their key strings (finalize.kvcolumns reads the
KV event stream as columns: tests/unit/finalize/test_kvcolumns.py)."""

import json
from pathlib import Path

from kvscope.records.base import read_jsonl


def test_rows_share_their_keys_and_torn_lines_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    lines = [json.dumps({"request_uuid": f"r{i}", "cached_tokens": i}) for i in range(3)]
    path.write_text("\n".join([*lines, '{"request_uuid": "torn', ""]) + "\n")
    rows, bad = read_jsonl(path)
    assert [r["cached_tokens"] for r in rows] == [0, 1, 2] and bad == 1
    first, second = (list(r) for r in rows[:2])
    assert all(a is b for a, b in zip(first, second, strict=True))  # one key object per name
    converted, _ = read_jsonl(path, lambda r: r["request_uuid"])
    assert converted == ["r0", "r1", "r2"]


def test_lines_orjson_refuses_are_read_by_json(tmp_path: Path) -> None:
    """Python's json writes NaN and integers past 64 bits; such rows are kept, not skipped."""
    path = tmp_path / "s.jsonl"
    rows = [{"x": float("nan"), "k": "a"}, {"x": 2**70, "k": "b"}, {"x": 1.5, "k": "c"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + b"\xff\n".decode("latin-1"))
    read, bad = read_jsonl(path)
    assert [r["k"] for r in read] == ["a", "b", "c"] and bad == 1
    assert read[0]["x"] != read[0]["x"] and read[1]["x"] == 2**70
