"""Arrow IPC streams of token ids (records.base.ArrowWriter / ArrowBatches / compact): appended a
record batch at a time, a torn tail left off up to the last complete batch, reopened after a
crash, part files of other processes merged at close, ids outside [0, 2**32) refused."""

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from kvscope.collect.kv_events import KvEventListener
from kvscope.finalize.prompts import load_prompts
from kvscope.probe.streams import CallStreams, merge_parts, token_writer
from kvscope.records import base
from kvscope.records.base import ArrowBatches, ArrowWriter, compact
from kvscope.records.kv_events import BATCHES_SCHEMA, KvBatch, KvEvent
from kvscope.records.tokens import (
    TOKENS_ARROW,
    TOKENS_SCHEMA,
    PromptTokenIds,
    has_tokens,
    load_tokens,
)

CALLS = [PromptTokenIds(f"u{i}", tuple(range(i, 3 * i))) for i in range(6)]


def written(path: Path, calls: list[PromptTokenIds] = CALLS) -> bytes:
    with token_writer(path) as w:
        for c in calls:
            w.append(c)
    return path.read_bytes()


def uuids(path: Path) -> list[str]:
    return [r["request_uuid"] for b in ArrowBatches(path) for r in b.to_pylist()]


def test_each_call_is_a_batch_readable_as_soon_as_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / TOKENS_ARROW
    w = token_writer(path)
    assert not list(ArrowBatches(path))  # the schema alone
    w.append(CALLS[3])  # flushed: a reader sees it before close
    assert uuids(path) == ["u3"] and load_tokens(tmp_path)["u3"].tolist() == [3, 4, 5, 6, 7, 8]
    w.close()
    w.append(CALLS[4])  # after close: dropped
    assert (w.rows, uuids(path)) == (1, ["u3"])


def test_a_torn_tail_keeps_every_complete_batch_before_it(tmp_path: Path) -> None:
    whole = written(tmp_path / "whole.arrow")
    last = CALLS[-1].to_batch().serialize().size
    path = tmp_path / TOKENS_ARROW
    for cut in range(1, last):  # cut anywhere in the last batch's message
        path.write_bytes(whole[: len(whole) - cut])
        read = ArrowBatches(path)
        assert [r["request_uuid"] for b in read for r in b.to_pylist()] == [
            "u0",
            "u1",
            "u2",
            "u3",
            "u4",
        ]
        assert read.torn == 1
    read = ArrowBatches(tmp_path / "whole.arrow")
    assert len(list(read)) == len(CALLS) and read.torn == 0
    path.write_bytes(whole[:5])  # not even the schema
    assert not list(ArrowBatches(path)) and load_tokens(tmp_path) == {}


def test_reopening_cuts_a_torn_tail_off_and_appends(tmp_path: Path) -> None:
    path = tmp_path / TOKENS_ARROW
    whole = written(path, CALLS[:3])
    path.write_bytes(whole[:-7])  # a crash in u2's batch
    written(path, CALLS[3:])  # the next writer (a resumed process)
    assert uuids(path) == ["u0", "u1", "u3", "u4", "u5"]
    assert ArrowBatches(path).torn == 0


def test_a_file_of_another_kind_is_not_appended_to(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"request_uuid": "x", "token_ids": [1]}\n')
    with pytest.raises(ValueError, match="not an Arrow IPC stream"):
        token_writer(tmp_path / "a.jsonl")
    assert (tmp_path / "a.jsonl").read_text().startswith("{")  # untouched
    with ArrowWriter[KvBatch](tmp_path / "kv.arrow", BATCHES_SCHEMA, KvBatch.to_batch) as w:
        w.append(KvBatch(seq=1, ts_ns=1))
    with pytest.raises(ValueError, match="another schema"):
        token_writer(tmp_path / "kv.arrow")


@pytest.mark.parametrize("bad", [-1, 2**32, 2**64])
def test_an_id_outside_uint32_is_refused_and_nothing_is_written(tmp_path: Path, bad: int) -> None:
    path = tmp_path / TOKENS_ARROW
    with token_writer(path) as w:
        with pytest.raises(ValueError, match=r"outside \[0, 2\*\*32\)"):
            w.append(PromptTokenIds("x", (1, bad)))
        w.append(PromptTokenIds("y", (0, 2**32 - 1)))
    assert {u: a.tolist() for u, a in load_tokens(tmp_path).items()} == {"y": [0, 2**32 - 1]}
    assert load_tokens(tmp_path)["y"].dtype == "int64"  # past int32: the narrowest rule
    with pytest.raises(ValueError, match="KV batch 3"):
        KvBatch(seq=3, ts_ns=1, events=(KvEvent("stored", (1,), None, (bad,), 4),)).to_batch()


def test_dtypes_last_record_wins_and_null_ids_are_ignored(tmp_path: Path) -> None:
    calls = [PromptTokenIds("a", (1, 2)), PromptTokenIds("b", ()), PromptTokenIds("a", (7,))]
    written(tmp_path / TOKENS_ARROW, calls)
    null = pa.RecordBatch.from_pylist([{"request_uuid": "a", "token_ids": None}], TOKENS_SCHEMA)
    with token_writer(tmp_path / TOKENS_ARROW) as w:
        w.append_batch(null)
    got = load_tokens(tmp_path)
    assert {u: a.tolist() for u, a in got.items()} == {"a": [7], "b": []}
    assert {str(a.dtype) for a in got.values()} == {"uint16"}
    written(tmp_path / TOKENS_ARROW, [PromptTokenIds("c", (70_000,))])  # a wider id widens all
    assert {str(a.dtype) for a in load_tokens(tmp_path).values()} == {"int32"}


def test_part_files_of_other_processes_are_merged_at_close(tmp_path: Path) -> None:
    own = CallStreams(tmp_path, tokens=True, payloads=False)
    own.token(CALLS[0])
    child = CallStreams(tmp_path, tokens=True, payloads=False, part=".4242")
    child.token(CALLS[1])
    child.close()  # a part's close merges nothing
    other = tmp_path / f"{TOKENS_ARROW}.777"
    other.write_bytes(written(tmp_path / "x.arrow", CALLS[2:4])[:-3])  # its last batch torn
    assert has_tokens(tmp_path) and (tmp_path / f"{TOKENS_ARROW}.4242").exists()
    own.close()
    assert not list(tmp_path.glob(f"{TOKENS_ARROW}.*"))
    assert uuids(tmp_path / TOKENS_ARROW) == ["u0", "u1", "u2"]  # pids in suffix order
    assert len(list(ArrowBatches(tmp_path / TOKENS_ARROW))) == 1  # rewritten in one batch
    assert merge_parts(tmp_path) == 0


def test_compaction_keeps_the_records_and_a_failed_one_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / TOKENS_ARROW
    whole = written(path)
    path.write_bytes(whole + whole[-20:])  # a torn tail
    assert compact(path, TOKENS_SCHEMA) and uuids(path) == [c.request_uuid for c in CALLS]
    assert not list(tmp_path.glob(".*"))
    before = path.read_bytes()
    os.chmod(tmp_path, 0o500)  # no new file can be made: the stream stays as it was
    try:
        refused = os.geteuid() != 0 and not compact(path, TOKENS_SCHEMA)
    finally:
        os.chmod(tmp_path, 0o700)
    assert path.read_bytes() == before and (refused or os.geteuid() == 0)


def test_the_listener_writes_an_arrow_stream_and_compacts_it_at_stop(tmp_path: Path) -> None:
    listener = KvEventListener("tcp://127.0.0.1:1", tmp_path / "kv.arrow", drain_s=0.01)
    listener._stream = ArrowWriter(listener.path, BATCHES_SCHEMA, KvBatch.to_batch)
    listener._thread = threading.Thread(target=lambda: None)  # as if started
    listener._thread.start()
    for seq in range(3):
        assert listener._write(KvBatch(seq=seq, ts_ns=seq), seq, "live")
    wide = KvBatch(seq=3, ts_ns=3, events=(KvEvent("stored", (1,), None, (2**32,), 1),))
    assert not listener._write(wide, 3, "live")  # counted undecodable, not written
    assert listener._bad == 1 and len(list(ArrowBatches(listener.path))) == 3  # one a batch
    summary = listener.stop()
    assert (summary.batches, summary.undecodable) == (3, 1)
    read = list(ArrowBatches(listener.path))
    assert len(read) == 1 and read[0].column(0).to_pylist() == [0, 1, 2]  # compacted


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 20])  # a record a chunk; all in one
def test_load_prompts_reads_the_stream_as_load_tokens_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    monkeypatch.setattr(base, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(base.ArrowBatches.chunks, "__defaults__", (chunk_bytes,))
    head = tuple(range(300))
    calls = [PromptTokenIds(f"u{i}", (*head[: 50 * i], i)) for i in range(5)]
    calls += [PromptTokenIds("u1", (9, 8)), PromptTokenIds("wide", (70_000, 1))]
    written(tmp_path / TOKENS_ARROW, calls)
    want, got = load_tokens(tmp_path), load_prompts(tmp_path)
    assert set(got.index) == set(want) == {"u0", "u1", "u2", "u3", "u4", "wide"}
    for u, ids in want.items():
        assert got.tokens(got.index[u]).tolist() == ids.tolist()
    assert got.dtype == np.int32 and got.tokens(got.index["u1"]).tolist() == [9, 8]
