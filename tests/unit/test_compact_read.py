"""Reading large streams compactly: shared row keys, KV event token ids as arrays."""

import json
from pathlib import Path

import numpy as np

from kvscope.records.base import read_jsonl
from kvscope.records.kv_events import KvBatch, KvEvent, read_batches


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


def test_compact_events_hold_the_same_ids_as_arrays(tmp_path: Path) -> None:
    stored = KvEvent("stored", (1, 2), None, (5, 70_000, 3, 4), 2, "GPU", "u")
    big = KvEvent("stored", (3,), 2, (2**40, 1), 2, None, "v")
    path = tmp_path / "kv_events.jsonl"
    batches = [KvBatch(seq=1, ts_ns=9, events=(big,)), KvBatch(seq=0, ts_ns=5, events=(stored,))]
    path.write_text("".join(json.dumps(b.to_dict()) + "\n" for b in batches))
    plain, _ = read_batches(path)
    assert [b.seq for b in plain] == [0, 1] and plain[0].events == (stored,)
    compact, _ = read_batches(path, compact=True)
    ids = compact[0].events[0].token_ids
    assert isinstance(ids, np.ndarray) and ids.dtype == np.int32 and not ids.flags.writeable
    assert ids.tolist() == [5, 70_000, 3, 4]
    wide = compact[1].events[0].token_ids
    assert isinstance(wide, np.ndarray) and wide.dtype == np.int64 and wide.tolist() == [2**40, 1]
