"""finalize.kvcolumns: a KV event stream read as columns from its Arrow record batches
(read_columns) is the stream read as KvBatch objects (read_batches + columns_of), an older run's
JSONL stream gives the same columns, and the event table and the block ledger built from the
columns give, on a hand-made stream, what the object-per-event code gave.

Block size 4. In seq order: A stores S (2 blocks); C stores 2 blocks on a parent never seen
(orphans; the second is partial); D stores a block of size 8 and it is evicted in the same
step (the other batch of seq 1: C stored first); B stores a block behind A's and its step
evicts A's first; a block of no size chains on B's; a removal names a block never stored; E
stores a block of no tokens; a reset clears the cache; F stores behind a cleared block.
"""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ROOT

from kvscope.finalize import finalize, kvcolumns, tables
from kvscope.finalize.blocktable import CLEARED, EVICTED, STILL_CACHED
from kvscope.finalize.kvcolumns import KvColumns, columns_of, events_table, read_columns
from kvscope.finalize.ledger import KEYED, ORPHAN, UNMATCHABLE, build_ledger, ledger_of
from kvscope.probe.streams import token_writer
from kvscope.records import blockkey
from kvscope.records.base import ArrowWriter
from kvscope.records.kv_events import (
    BATCHES_SCHEMA,
    KV_EVENTS_ARROW,
    KV_EVENTS_JSONL,
    REPLAY,
    KvBatch,
    KvEvent,
    events_of,
    read_batches,
)
from kvscope.records.tokens import TOKENS_ARROW, TOKENS_JSONL, PromptTokenIds, load_tokens

S = list(range(100, 108))  # two full blocks


def stored(
    hashes: list[int], parent: int | None, tokens: list[int], session: str | None,
    size: int | None = 4, medium: str | None = "GPU",
) -> KvEvent:  # fmt: skip
    return KvEvent("stored", tuple(hashes), parent, tuple(tokens), size, medium, session)


BATCHES = [  # as written; in seq order 0, 1, 1, 2, 3, 4, 5, 6, 8 (7 is missing)
    KvBatch(seq=0, ts_ns=10, received_ns=11, events=(
        stored([90], None, [1, 2, 3, 4], "Z", size=None),  # before any size: no life
        stored([1, 2], None, S, "A"),
    )),
    KvBatch(seq=2, ts_ns=30, source=REPLAY, events=(  # received_ns None
        KvEvent("removed", (1,)),
        stored([3], 2, [5, 6, 7, 8], "B"),
    )),
    KvBatch(seq=1, ts_ns=20, received_ns=21, events=(stored([4, 5], 99, S[:6], "C"),)),
    KvBatch(seq=1, ts_ns=25, received_ns=26, events=(  # the same seq: after the one before
        stored([6], None, S, "D", size=8),
        KvEvent("removed", (6,)),
    )),
    KvBatch(seq=3, ts_ns=40, received_ns=41, events=(
        stored([7], 3, [9, 9, 9, 9], None, size=None, medium=None),  # the ledger's size
    )),
    KvBatch(seq=4, ts_ns=50, received_ns=51, events=(
        KvEvent("removed", (3, 42)),
        stored([8], None, [], "E"),
    )),
    KvBatch(seq=5, ts_ns=60, received_ns=61, events=(KvEvent("cleared"),)),
    KvBatch(seq=6, ts_ns=70, received_ns=71),
    KvBatch(seq=8, ts_ns=90, received_ns=91, events=(stored([9], 7, [1, 1, 1, 1], "F"),)),
]  # fmt: skip
TORN = '{"seq": 9, "ts_ns": 99, "events": [{"kind": "stored", "token_ids": [1, 2'


def write_arrow(path: Path, batches: list[KvBatch], torn: int = 0) -> Path:
    """The stream as the listener writes it, then the first `torn` bytes of one more batch (a
    write cut short by a crash)."""
    with ArrowWriter(path, BATCHES_SCHEMA, KvBatch.to_batch) as w:
        for b in batches:
            w.append(b)
    extra = KvBatch(seq=9, ts_ns=99, events=(stored([10], None, [1, 2, 3, 4], "G"),))
    with path.open("ab") as f:
        f.write(extra.to_batch().serialize().to_pybytes()[:torn])
    return path


def write(path: Path, batches: list[KvBatch], compact: bool, extra: tuple[str, ...] = ()) -> Path:
    """An older run's JSONL stream, as its listener wrote it (compact) or as json.dumps does by
    default."""
    sep = (",", ":") if compact else None
    lines = [json.dumps(b.to_dict(), separators=sep) for b in batches]
    lines[3:3] = ["", *extra]  # a blank line and the extra lines in the middle
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_same(a: KvColumns, b: KvColumns) -> None:
    for name, x in vars(a).items():
        y = getattr(b, name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        elif isinstance(x, pa.Array):
            assert x.equals(y), name
        else:
            assert x == y, name


@pytest.mark.parametrize("torn", [0, 3, 40, 300])  # none; in its length, metadata, body
@pytest.mark.parametrize("chunk_bytes", [1, 1 << 20])  # a batch a chunk; all in one
def test_the_stream_is_read_as_the_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: int, chunk_bytes: int
) -> None:
    monkeypatch.setattr(kvcolumns, "_CHUNK_BYTES", chunk_bytes)
    path = write_arrow(tmp_path / KV_EVENTS_ARROW, BATCHES, torn)
    columns = read_columns(path)
    back, left_off = read_batches(path)
    assert (columns.torn, left_off) == (int(torn > 0),) * 2 and len(back) == len(BATCHES)
    assert_same(columns, replace(columns_of(back), torn=int(torn > 0)))
    assert columns.n_tokens.tolist()[:3] == [4, 8, 6]  # token ids read as one flat array


def test_a_stream_of_no_batch(tmp_path: Path) -> None:
    columns = read_columns(write_arrow(tmp_path / KV_EVENTS_ARROW, [], torn=5))
    assert (len(columns), columns.batches, columns.torn, columns.ledger_size) == (0, 0, 1, None)


@pytest.mark.parametrize("compact", [True, False])
def test_an_older_runs_jsonl_stream_gives_the_same_columns(tmp_path: Path, compact: bool) -> None:
    old = read_columns(write(tmp_path / KV_EVENTS_JSONL, BATCHES, compact, (TORN,)))
    new = read_columns(write_arrow(tmp_path / KV_EVENTS_ARROW, BATCHES))
    assert old.torn == 1
    assert_same(old, replace(new, torn=1))


def test_the_counts() -> None:
    c = columns_of(sorted(BATCHES, key=lambda b: b.seq))
    assert (c.batches, len(c), c.missing, c.recovered) == (9, 12, 1, 1)
    assert c.seq.tolist() == [0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 5, 8]
    assert c.ledger_size == 4 and c.first_row.tolist()[-1] == 15


def test_unreadable_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    bad = [
        TORN,
        '{"seq": 9, "ts_ns": 1, "events": [{"kind": "stored", "token_ids": ["a"]}]}',
        '{"seq": 9, "ts_ns": 1, "events": [{"kind": "moved", "block_hashes": [], '
        '"token_ids": []}]}',  # no such kind
        '{"ts_ns": 1, "events": []}',  # no seq
        "[1, 2]",
    ]
    path = write(tmp_path / "kv.jsonl", BATCHES, compact=True, extra=tuple(bad))
    columns = read_columns(path)
    assert columns.torn == len(bad) and columns.batches == len(BATCHES)
    whole = read_columns(write(tmp_path / "whole.jsonl", BATCHES, compact=True))
    assert_same(columns, replace(whole, torn=len(bad)))


def test_the_event_table() -> None:
    table = events_table(columns_of(sorted(BATCHES, key=lambda b: b.seq)), "r0")
    assert table.schema.names[-1] == "replica" and set(table["replica"].to_pylist()) == {"r0"}
    assert [tuple(r.values())[:10] for r in table.to_pylist()] == [
        (0, 10, 11, "live", "stored", 90, None, 0, "Z", "GPU"),  # no size: no tokens counted
        (0, 10, 11, "live", "stored", 1, None, 4, "A", "GPU"),
        (0, 10, 11, "live", "stored", 2, 1, 4, "A", "GPU"),
        (1, 20, 21, "live", "stored", 4, 99, 4, "C", "GPU"),
        (1, 20, 21, "live", "stored", 5, 4, 2, "C", "GPU"),
        (1, 25, 26, "live", "stored", 6, None, 8, "D", "GPU"),
        (1, 25, 26, "live", "removed", 6, None, None, None, None),
        (2, 30, None, "replay", "removed", 1, None, None, None, None),
        (2, 30, None, "replay", "stored", 3, 2, 4, "B", "GPU"),
        (3, 40, 41, "live", "stored", 7, 3, 0, None, None),
        (4, 50, 51, "live", "removed", 3, None, None, None, None),
        (4, 50, 51, "live", "removed", 42, None, None, None, None),
        (4, 50, 51, "live", "stored", 8, None, 0, "E", "GPU"),
        (5, 60, 61, "live", "cleared", None, None, None, None, None),
        (8, 90, 91, "live", "stored", 9, 7, 4, "F", "GPU"),
    ]  # fmt: skip


def test_the_ledger() -> None:
    ledger = ledger_of(columns_of(sorted(BATCHES, key=lambda b: b.seq)))
    assert ledger.block_hash.tolist() == [1, 2, 4, 5, 6, 3, 7, 8, 9]
    k, u, o = KEYED, UNMATCHABLE, ORPHAN
    assert ledger.key_state.tolist() == [k, k, o, o, u, k, k, u, o]
    assert ledger.tokens.tolist() == [4, 4, 4, 2, 8, 4, 4, 0, 4]
    assert ledger.stored_ns.tolist() == [10, 10, 20, 20, 25, 30, 40, 50, 90]
    assert ledger.seq.tolist() == [0, 0, 1, 1, 1, 2, 3, 4, 8]
    assert ledger.removed_ns.tolist() == [30, 60, 60, 60, 25, 50, 60, 60, 0]
    e, c, n = EVICTED, CLEARED, STILL_CACHED
    assert ledger.removal.tolist() == [e, c, c, c, e, e, c, c, n]
    assert ledger.session_id == ["A", "A", "C", "C", "D", "B", None, "E", "F"]
    assert ledger.evictor == ["B", None, None, None, "C", "E", None, None, None]
    assert (ledger.block_size, ledger.orphan_blocks) == (4, 3)
    keys, _, _ = blockkey.prompt_blocks([np.array([*S, 5, 6, 7, 8, 9, 9, 9, 9])], 4)
    assert ledger.key[[0, 1, 5, 6]].tolist() == keys.tolist()  # S, then B's, then 7 behind it


def test_build_ledger_reads_pairs_in_the_order_given() -> None:
    pairs = list(events_of(BATCHES))  # as written: seq 2 before seq 1
    ledger = build_ledger(pairs)
    assert ledger.block_hash.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert ledger.removal.tolist()[:3] == [EVICTED, CLEARED, EVICTED]


RECORDED = ROOT / "tests" / "fixtures" / "recorded-runs"


def as_arrow(run: Path) -> None:
    """An older run's JSONL streams of token ids rewritten as kvscope writes them now."""
    tokens = load_tokens(run)
    with token_writer(run / TOKENS_ARROW) as w:
        for uuid, ids in tokens.items():
            w.append(PromptTokenIds(uuid, tuple(ids.tolist())))
    write_arrow(run / KV_EVENTS_ARROW, read_batches(run / KV_EVENTS_JSONL)[0])
    (run / TOKENS_JSONL).unlink()
    (run / KV_EVENTS_JSONL).unlink()


def test_finalize_writes_the_same_from_either_form_and_the_batch_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = next(p for p in RECORDED.iterdir() if (p / KV_EVENTS_JSONL).exists())
    old, new, objects = tmp_path / "old", tmp_path / "new", tmp_path / "objects"
    for copy in (old, new, objects):
        shutil.copytree(run, copy)
    as_arrow(new)
    finalize(old)
    finalize(new)
    monkeypatch.setattr(tables, "read_columns", lambda p: columns_of(read_batches(p)[0]))
    finalize(objects)
    for other in (new, objects):
        for name in ("kv_events.parquet", "blocks.parquet", "requests.parquet", "finalize.json"):
            if name.endswith(".parquet"):
                assert pq.read_table(old / name).equals(pq.read_table(other / name)), name
            else:
                assert (old / name).read_text() == (other / name).read_text()
    assert pq.read_table(old / "blocks.parquet").num_rows > 0
    assert pq.read_table(new / "requests.parquet")["max_reusable_tokens"].null_count == 0
