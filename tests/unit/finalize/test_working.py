"""finalize.working: the request stream read as the full table plus slim working rows."""

import json
from pathlib import Path
from typing import Any

import pytest

from kvscope.finalize import working
from kvscope.records import requests


def _row(n: int, **extra: Any) -> dict[str, Any]:
    base = {
        "benchmark_run_id": "b", "experiment_name": "e", "configuration_hash": "h",
        "timestamp": f"t{n}", "workflow_type": "peer", "request_uuid": f"r{n}",
        "model_name": "m", "status": "ok", "start_ns": 10 * n, "end_ns": 10 * n + 5,
        "agent_id": "planner", "prompt_tokens": 100 + n, "ttft_ms": 1.5 * n,
        "prompt_hash": f"{n:016x}", "replica": "r1" if n == 1 else None,
    }  # fmt: skip
    return base | extra


def _write(path: Path, rows: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_the_table_is_every_column_and_the_rows_only_the_kept_ones(tmp_path: Path) -> None:
    rows = [_row(n) for n in range(3)]
    _write(tmp_path / requests.REQUESTS_JSONL, rows)
    stream = working.read(tmp_path)
    assert stream.table.equals(requests.to_table(rows)) and stream.skipped == 0
    assert [set(r) for r in stream.rows] == [set(working.KEPT)] * 3
    assert [r["prompt_tokens"] for r in stream.rows] == [100, 101, 102]
    assert stream.rows[0]["status"] is stream.rows[2]["status"]  # one object down a column
    assert "ttft_ms" not in stream.rows[0]  # neither read nor set by finalize


def test_a_torn_line_or_an_odd_value_is_read_line_by_line(tmp_path: Path) -> None:
    rows = [_row(n) for n in range(3)]
    path = tmp_path / requests.REQUESTS_JSONL
    _write(path, rows, tail='{"request_uuid": "r9", "sta')
    torn = working.read(tmp_path)
    assert torn.skipped == 1 and torn.table.equals(requests.to_table(rows))
    assert [r["request_uuid"] for r in torn.rows] == ["r0", "r1", "r2"]
    _write(path, [*rows[:2], rows[2] | {"prompt_tokens": 102.0, "extra_key": [1]}])
    odd = working.read(tmp_path)  # pyarrow's reader refuses a float in an int64 column
    assert odd.skipped == 0 and odd.table.column("prompt_tokens").to_pylist() == [100, 101, 102]
    assert [r["prompt_tokens"] for r in odd.rows] == [100, 101, 102]  # the rows are the table's


def test_table_with_takes_the_set_columns_the_rows_hold(tmp_path: Path) -> None:
    rows = [_row(n) for n in range(3)]
    _write(tmp_path / requests.REQUESTS_JSONL, rows)
    stream = working.read(tmp_path)
    stream.rows[0]["max_reusable_tokens"] = 7  # set on one row only
    for r in stream.rows[::2]:
        r["replica"] = "r0"
    stream.rows[1]["ttft_ms"] = 99.0  # not finalize's: never written back
    out = working.table_with(stream.table, stream.rows)
    assert out.column("max_reusable_tokens").to_pylist() == [7, None, None]
    assert out.column("replica").to_pylist() == ["r0", "r1", "r0"]  # r1: the stream's value
    assert out.column("ttft_ms").to_pylist() == [0.0, 1.5, 3.0]
    assert out.schema.equals(requests.ARROW_SCHEMA)
    unchanged = [c for c in out.column_names if c not in {"max_reusable_tokens", "replica"}]
    assert out.select(unchanged).equals(stream.table.select(unchanged))


def test_table_with_refuses_rows_that_are_not_the_tables() -> None:
    with pytest.raises(ValueError, match="0 working rows for a table of 1"):
        working.table_with(requests.to_table([_row(0)]), [])
