"""A token-id trace as Arrow (sim/inputs/arrow_tokens.py): the same requests as the JSONL trace
replay identically, kvscope's own prompt-token stream is read, bad columns and rows are refused
with the row, a torn stream is read to its last whole batch."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from kvscope.errors import KvscopeError
from kvscope.records.tokens import TOKENS_SCHEMA
from kvscope.sim.inputs import arrow_tokens
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.trace import Trace

ROWS: list[dict[str, Any]] = [
    {"request_id": "a", "token_ids": [1, 2, 3, 4, 5], "timestamp": 5.0, "agent": "planner",
     "workflow": "w1", "output_length": 3},
    {"request_id": "b", "token_ids": [1, 2, 3, 4, 9, 9, 9], "timestamp": None,
     "agent": "executor", "workflow": "w1", "output_length": None, "end_timestamp": 40.0},
    {"request_id": "c", "token_ids": [], "timestamp": 2.5, "agent": None, "workflow": "w2",
     "output_length": 0, "previous_agent": "critic"},
    {"request_id": "d", "token_ids": [7] * 9, "timestamp": 9.0, "agent": "planner",
     "workflow": "w2", "output_length": 1},
]  # fmt: skip
FIELDS = ("keys", "offsets", "start_s", "end_s", "prompt_tokens", "output_tokens")
LABELS = ("request_ids", "agents", "workflows", "previous_agents")


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    clean = [{k: v for k, v in r.items() if v is not None} for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in clean))
    return path


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    names = ["request_id", "token_ids", "timestamp", "end_timestamp", "agent", "workflow",
             "previous_agent", "output_length"]  # fmt: skip
    types = [pa.string(), pa.list_(pa.int64()), pa.float64(), pa.float64(), pa.string(),
             pa.string(), pa.string(), pa.int64()]  # fmt: skip
    schema = pa.schema(list(zip(names, types, strict=True)))
    return pa.Table.from_pylist([{n: r.get(n) for n in names} for r in rows], schema=schema)


def _stream(path: Path, table: pa.Table, rows_per_batch: int = 1) -> Path:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=rows_per_batch):
            w.write_batch(batch)
    return path


def _file(path: Path, table: pa.Table) -> Path:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return path


def _parquet(path: Path, table: pa.Table) -> Path:
    import pyarrow.parquet as pq

    text = pa.array(["a dataset's own column, not read"] * table.num_rows)
    pq.write_table(table.append_column("text", text), path, row_group_size=2)
    return path


def assert_same(a: Trace, b: Trace) -> None:
    for name in FIELDS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for name in LABELS:
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.parametrize("group_bytes", [1, 1 << 20])
def test_arrow_stream_and_file_replay_as_the_jsonl_trace(
    tmp_path: Path, group_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrow_tokens, "GROUP_BYTES", group_bytes)
    text = load_source(_jsonl(tmp_path / "t.jsonl", ROWS), block_size=2)
    for path in (
        _stream(tmp_path / "t.arrow", _table(ROWS)),
        _file(tmp_path / "f.arrow", _table(ROWS)),
        _parquet(tmp_path / "p.data", _table(ROWS)),  # told by its bytes, not its name
    ):
        binary = load_source(path, block_size=2)
        assert binary.kind == "tokens" and binary.notes == text.notes
        assert_same(binary.trace, text.trace)
    assert text.trace.request_ids == ("b", "c", "a", "d")  # b at its position (1 ms)
    assert text.notes == ["1 requests without output_length: replayed with 0"]


def test_kvscopes_own_prompt_token_stream_is_a_trace(tmp_path: Path) -> None:
    calls = {"u1": [5, 6, 7, 8], "u2": [5, 6, 7, 8, 1, 2], "u3": [(1 << 32) - 1] * 4}
    table = pa.Table.from_pylist(
        [{"request_uuid": k, "token_ids": v} for k, v in calls.items()], schema=TOKENS_SCHEMA
    )
    source = load_source(_stream(tmp_path / "prompt_tokens.arrow", table), block_size=2)
    trace = source.trace
    assert trace.request_ids == ("u1", "u2", "u3") and trace.prompt_tokens.tolist() == [4, 6, 4]
    assert trace.blocks_of(0).tolist() == trace.blocks_of(1)[:2].tolist()
    as_jsonl = [{"request_id": k, "token_ids": v} for k, v in calls.items()]
    assert_same(trace, load_source(_jsonl(tmp_path / "t.jsonl", as_jsonl), block_size=2).trace)


def test_a_torn_stream_is_read_to_its_last_whole_batch(tmp_path: Path) -> None:
    path = _stream(tmp_path / "t.arrow", _table(ROWS))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 60])  # into the last batch (and the end marker)
    source = load_source(path, block_size=2)
    assert source.trace.request_ids == ("b", "c", "a")
    assert any("cut short" in n for n in source.notes)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"request_id": ["a"], "token_ids": [[1.5]]}, "double>, not a list of integers"),
        ({"request_id": ["a"], "tokens": [[1]]}, "no token_ids column"),
        ({"token_ids": [[1], None]}, "row 2 has no token_ids"),
        ({"token_ids": [[1], [2, None]]}, "row 2: a null token id"),
        ({"token_ids": [[1], [2], [3, -4]]}, "row 3: a negative token id"),
        ({"token_ids": [[1], [2]], "output_length": [1, -1]}, "row 2 has a negative output_len"),
        ({"token_ids": [[1]], "timestamp": ["x"]}, "'timestamp' is string, not numbers"),
        ({"token_ids": [[1]], "output_length": [1.5]}, "'output_length' is double, not integers"),
        ({"token_ids": [[1]], "agent": [3]}, "column 'agent' is int64, not strings"),
    ],
)
@pytest.mark.parametrize("parquet", [False, True])
def test_bad_columns_and_rows_are_refused_naming_the_row(
    tmp_path: Path,
    columns: dict[str, list[Any]],
    message: str,
    parquet: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(arrow_tokens, "GROUP_BYTES", 1)  # a row per group: rows still count on
    table = pa.table(columns)
    path = _parquet(tmp_path / "t.parquet", table) if parquet else _stream(tmp_path / "t", table)
    with pytest.raises(KvscopeError) as err:
        load_source(path, block_size=2)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_an_arrow_trace_needs_a_block_size(tmp_path: Path) -> None:
    path = _file(tmp_path / "t.arrow", _table(ROWS))
    with pytest.raises(KvscopeError, match="Arrow token-id trace: say its block size"):
        load_source(path)


def test_a_torn_parquet_file_is_refused(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "t.parquet", _table(ROWS))
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(KvscopeError, match="not a readable Parquet file"):
        load_source(path, block_size=2)
