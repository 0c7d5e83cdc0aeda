"""The run directory's records: each stream's record, schema and file name; the appenders and
readers (JSONL; Arrow IPC streams: tests/unit/records/test_arrow_streams.py)."""

import threading
from dataclasses import fields
from pathlib import Path

import pyarrow as pa
import pytest

from kvscope.finalize.kvcolumns import columns_of, events_table
from kvscope.probe.streams import token_writer
from kvscope.records import base, blocks, kv_events, metrics, requests, run_dir, tokens
from kvscope.records.finalized import Finalized, KvReport


@pytest.mark.parametrize(
    ("record", "schema"),
    [
        (requests.RequestRecord, requests.ARROW_SCHEMA),
        (blocks.BlockRecord, blocks.BLOCKS_SCHEMA),
        (metrics.MetricSample, metrics.SCHEMA),
    ],
)
def test_each_table_schema_is_its_record(record: type, schema: pa.Schema) -> None:
    assert schema.names == [f.name for f in fields(record)]
    optional = {f.name for f in fields(record) if "None" in str(f.type)}
    assert {f.name for f in schema if f.nullable} == optional


def test_file_names_are_distinct_and_the_artifacts_are_among_them() -> None:
    names = [
        requests.REQUESTS_JSONL, requests.REQUESTS_PARQUET, tokens.TOKENS_JSONL,
        tokens.TOKENS_ARROW, kv_events.KV_EVENTS_ARROW,
        metrics.METRICS_PARQUET, metrics.METRICS_GAPS, metrics.METRICS_JSONL,
        kv_events.KV_EVENTS_JSONL, kv_events.KV_EVENTS_PARQUET, kv_events.KV_SUMMARY,
        blocks.BLOCKS_PARQUET, run_dir.CONFIG_YAML, run_dir.RUN_JSON, run_dir.ENVIRONMENT_JSON,
        run_dir.LAUNCH_COMMAND, run_dir.ENGINE_LOG, run_dir.FINALIZE_JSON, run_dir.SUMMARY_JSON,
        run_dir.TIMELINE_PNG, run_dir.EVICTIONS_PNG, run_dir.REPORT_HTML, run_dir.REPORT_ERROR,
        run_dir.REPLAY_JSON, run_dir.REPLAY_PNG, run_dir.REPLICAS_DIR, run_dir.ROUTER_LOG,
        run_dir.ROUTER_METRICS,
    ]  # fmt: skip
    assert len(set(names)) == len(names)
    assert set(run_dir.ARTIFACTS) <= set(names)
    assert set(run_dir.REPLICA_ARTIFACTS) <= set(names)
    assert not {n for n in run_dir.ARTIFACTS if n.endswith(".jsonl")}  # streams fold into tables


@pytest.mark.parametrize("arrow", [False, True])
def test_the_appender_writes_whole_records_from_threads_and_the_reader_skips_a_torn_one(
    tmp_path: Path, arrow: bool
) -> None:
    path = tmp_path / (tokens.TOKENS_ARROW if arrow else tokens.TOKENS_JSONL)
    writer: base.JsonlWriter[tokens.PromptTokenIds] | base.ArrowWriter[tokens.PromptTokenIds] = (
        token_writer(path) if arrow else base.JsonlWriter(path)
    )

    def write(k: int) -> None:
        for i in range(50):
            writer.append(tokens.PromptTokenIds(f"r{k}-{i}", tuple(range(i))))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    writer.append(tokens.PromptTokenIds("late", (1,)))  # after close: dropped, not an error
    torn = tokens.PromptTokenIds("torn", (1, 2)).to_batch().serialize().to_pybytes()[:-9]
    with path.open("ab") as f:  # a write cut short by a crash
        f.write(torn if arrow else b'{"request_uuid": "torn", "token_')
    if arrow:
        read = base.ArrowBatches(path)
        rows, bad = [r for b in read for r in b.to_pylist()], read.torn
    else:
        rows, bad = base.read_jsonl(path)
    assert (len(rows), bad, writer.rows) == (200, 1, 200)
    loaded = tokens.load_tokens(tmp_path)  # the torn record left off
    assert loaded["r3-7"].tolist() == list(range(7)) and len(loaded) == 200


def test_kv_batches_round_trip_through_the_stream(tmp_path: Path) -> None:
    stored = kv_events.KvEvent("stored", (5, -6), None, (1, 2, 3, 4), 2, "GPU", "req-1")
    batches = [
        kv_events.KvBatch(seq=3, ts_ns=30, received_ns=31, source=kv_events.REPLAY,
                          events=(kv_events.KvEvent("removed", (5,)),)),
        kv_events.KvBatch(seq=1, ts_ns=10, received_ns=11, events=(stored,)),
    ]  # fmt: skip
    with base.ArrowWriter(
        tmp_path / kv_events.KV_EVENTS_ARROW, kv_events.BATCHES_SCHEMA, kv_events.KvBatch.to_batch
    ) as w:
        for b in batches:
            w.append(b)
    (tmp_path / "old").mkdir()
    with base.JsonlWriter[kv_events.KvBatch](tmp_path / "old" / kv_events.KV_EVENTS_JSONL) as j:
        for b in batches:
            j.append(b)  # as a run before the Arrow stream wrote it
    assert kv_events.events_path(tmp_path) == tmp_path / kv_events.KV_EVENTS_ARROW
    assert kv_events.read_batches_in(tmp_path / "none") == ([], 0)
    back, bad = kv_events.read_batches_in(tmp_path)
    assert bad == 0 and back == sorted(batches, key=lambda b: b.seq)  # seq order, equal records
    assert kv_events.read_batches_in(tmp_path / "old") == (back, 0)
    assert kv_events.holes(back) == (1, 1)  # seq 2 missing; one batch came by replay
    table = events_table(columns_of(back))
    assert table["parent_block_hash"].to_pylist() == [None, 5, None]  # the 2nd block chains


def test_finalize_json_round_trips(tmp_path: Path) -> None:
    done = Finalized(8, 1, 7, 28, KvReport(10, 23, 0, 0, 0, {"failed request": 1}, {"lost": 0}))
    done.write(tmp_path)
    assert Finalized.read(tmp_path) == done
    assert Finalized.read(tmp_path / "nothing") is None


def test_run_ids_and_their_names(tmp_path: Path) -> None:
    run_id, path = run_dir.new_run(tmp_path, "pressure-concurrency=2")
    assert path == tmp_path / run_id and path.is_dir()
    assert run_dir.run_name(run_id) == "pressure-concurrency=2"
    assert run_dir.run_name("not-a-run-id") == "not-a-run-id"
