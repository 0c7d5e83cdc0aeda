"""The KV event stream: every event batch the engine published, as received (kv_events.arrow), one
row per block event (kv_events.parquet), and the listener's own account (kv_events.summary.json).

Events are BlockStored / BlockRemoved / AllBlocksCleared, in kvscope's words "stored", "removed",
"cleared"; block hashes are signed 64-bit ints whatever the engine sent.

kv_events.arrow is an Arrow IPC stream (records.base.ArrowWriter) of BATCHES_SCHEMA: one record
batch (one row) per KvBatch received, every field of KvBatch with its events as a list of structs
of every field of KvEvent, token ids as list<uint32> (KvBatch.to_batch refuses an id outside
[0, 2**32): ValueError); written and flushed as received (a crash loses no received batch; a torn
last batch is left off on reading). Runs written before this format have kv_events.jsonl (one
KvBatch.to_dict per line), read the same way: read_batches / read_batches_in, and
finalize.kvcolumns.read_columns, take either.
"""

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from kvscope.records.base import ArrowBatches, read_jsonl, record_dict
from kvscope.records.formats import is_arrow_stream
from kvscope.records.tokens import id_lists

KV_EVENTS_ARROW = "kv_events.arrow"
KV_EVENTS_JSONL = "kv_events.jsonl"  # the stream of runs written before KV_EVENTS_ARROW: read only
KV_EVENTS_PARQUET = "kv_events.parquet"
KV_SUMMARY = "kv_events.summary.json"

Kind = Literal["stored", "removed", "cleared"]
LIVE, REPLAY = "live", "replay"  # how a batch reached kvscope


@dataclass(frozen=True)
class KvEvent:
    kind: Kind
    block_hashes: tuple[int, ...] = ()  # signed 64-bit
    parent_block_hash: int | None = None  # of the first block; each later one chains on the last
    token_ids: tuple[int, ...] = ()  # all blocks' tokens, block_size each
    block_size: int | None = None
    medium: str | None = None
    session_id: str | None = None  # the request's session_id (kvscope sends the request_uuid)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KvEvent":
        ids = {"block_hashes": tuple(d["block_hashes"]), "token_ids": tuple(d["token_ids"])}
        return cls(**(dict(d) | ids))


@dataclass(frozen=True, kw_only=True)
class KvBatch:
    """One published batch: one line of kv_events.jsonl."""

    seq: int
    ts_ns: int  # when the engine published it (its wall clock)
    received_ns: int | None = None  # kvscope's clock; None until received
    source: str = LIVE  # live | replay
    events: tuple[KvEvent, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    def to_batch(self) -> pa.RecordBatch:
        """This batch as a record batch of kv_events.arrow (BATCHES_SCHEMA), with no Python
        object per id; a ValueError for a token id outside [0, 2**32) or a block hash outside 64
        signed bits."""
        what = f"KV batch {self.seq} for {KV_EVENTS_ARROW}"
        es = self.events
        try:
            hashes = [np.fromiter(e.block_hashes, np.int64, len(e.block_hashes)) for e in es]
        except OverflowError as err:
            raise ValueError(f"{what}: a block hash outside 64 signed bits") from err
        hash_offsets = np.zeros(len(es) + 1, dtype=np.int32)
        np.cumsum([len(h) for h in hashes], out=hash_offsets[1:])
        flat = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.int64)
        columns = {
            "kind": pa.array([e.kind for e in es], pa.string()),
            "block_hashes": pa.ListArray.from_arrays(pa.array(hash_offsets), pa.array(flat)),
            "parent_block_hash": pa.array([e.parent_block_hash for e in es], pa.int64()),
            "token_ids": id_lists([e.token_ids for e in es], what),
            "block_size": pa.array([e.block_size for e in es], pa.int64()),
            "medium": pa.array([e.medium for e in es], pa.string()),
            "session_id": pa.array([e.session_id for e in es], pa.string()),
        }
        events = pa.StructArray.from_arrays(list(columns.values()), fields=list(EVENT_TYPE))
        listed = pa.ListArray.from_arrays(pa.array([0, len(es)], pa.int32()), events)
        return pa.RecordBatch.from_arrays(
            [
                pa.array([self.seq], pa.int64()),
                pa.array([self.ts_ns], pa.int64()),
                pa.array([self.received_ns], pa.int64()),
                pa.array([self.source], pa.string()),
                listed,
            ],
            schema=BATCHES_SCHEMA,
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KvBatch":
        events = tuple(KvEvent.from_dict(e) for e in d["events"])
        return cls(
            seq=d["seq"],
            ts_ns=d["ts_ns"],
            received_ns=d.get("received_ns"),
            source=d.get("source", LIVE),
            events=events,
        )


EVENT_TYPE = pa.struct(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("block_hashes", pa.list_(pa.int64())),
        pa.field("parent_block_hash", pa.int64()),
        pa.field("token_ids", pa.list_(pa.uint32())),
        pa.field("block_size", pa.int64()),
        pa.field("medium", pa.string()),
        pa.field("session_id", pa.string()),
    ]
)
BATCHES_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("received_ns", pa.int64()),
        pa.field("source", pa.string()),
        pa.field("events", pa.list_(EVENT_TYPE)),
    ]
)


def events_path(folder: Path) -> Path | None:
    """A KV cache's event stream in `folder` (a run directory, a replica's): kv_events.arrow,
    else an older run's kv_events.jsonl; None when it has neither."""
    for name in (KV_EVENTS_ARROW, KV_EVENTS_JSONL):
        if (folder / name).exists():
            return folder / name
    return None


def read_batches_in(folder: Path) -> tuple[list[KvBatch], int]:
    """The batches of the event stream in `folder` (events_path), as read_batches gives them;
    none when it has no stream."""
    path = events_path(folder)
    return read_batches(path) if path is not None else ([], 0)


def read_batches(path: Path) -> tuple[list[KvBatch], int]:
    """A stream's batches in seq order (ties as written), and how many torn records were left
    off: a torn last batch of an Arrow stream, or an older run's JSONL lines that are not a
    batch (finalize reads a large run's stream as columns instead: finalize.kvcolumns)."""
    if is_arrow_stream(path):
        read = ArrowBatches(path)
        batches = [KvBatch.from_dict(d) for b in read for d in b.to_pylist()]
        bad = read.torn
    else:
        rows, bad = read_jsonl(path, _batch_or_none)
        batches = [b for b in rows if b is not None]
        bad += len(rows) - len(batches)
    return sorted(batches, key=lambda b: b.seq), bad


def _batch_or_none(d: Any) -> KvBatch | None:
    """A JSONL line's batch; None for a line of another shape."""
    try:
        return KvBatch.from_dict(d)
    except (KeyError, TypeError, ValueError):
        return None


def events_of(batches: Iterable[KvBatch]) -> Iterator[tuple[KvBatch, KvEvent]]:
    """(batch, event) pairs in publish order."""
    for b in batches:
        for e in b.events:
            yield b, e


def holes(batches: Sequence[KvBatch]) -> tuple[int, int]:
    """(missing seqs between the first and last batch kept, batches that came from replay)."""
    return missing_seqs({b.seq for b in batches}), sum(b.source == REPLAY for b in batches)


def missing_seqs(distinct: Collection[int]) -> int:
    """How many seqs lie between the least and greatest of `distinct` (each seq once) and are
    not among them."""
    return int(max(distinct) - min(distinct) + 1 - len(distinct)) if len(distinct) else 0


@dataclass(frozen=True)
class SeqGap:
    """Sequence numbers the listener never received live."""

    first_seq: int  # missing seqs first_seq .. last_seq
    last_seq: int
    seen_ns: int  # when the listener noticed (the next batch arrived), kvscope's clock
    recovered: int = 0  # of them, filled from the engine's replay socket at stop

    @property
    def missing(self) -> int:
        return self.last_seq - self.first_seq + 1


@dataclass(frozen=True)
class ListenSummary:
    """kv_events.summary.json: what the listener received and what it lost."""

    batches: int  # live + recovered
    events: int
    live: int
    recovered: int
    lost: int  # missing after replay: never papered over
    gaps: tuple[SeqGap, ...] = field(default_factory=tuple)
    undecodable: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = record_dict(self)
        d["gaps"] = [record_dict(g) | {"missing": g.missing} for g in self.gaps]
        return d


EVENTS_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),  # engine's publish time
        pa.field("received_ns", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # live | replay
        pa.field("kind", pa.string(), nullable=False),  # stored | removed | cleared
        pa.field("block_hash", pa.int64()),  # null for cleared
        pa.field("parent_block_hash", pa.int64()),  # stored: the block it chains on
        pa.field("tokens", pa.int32()),  # stored: tokens in the block
        pa.field("session_id", pa.string()),
        pa.field("medium", pa.string()),
        pa.field("replica", pa.string()),  # the replica that published it; null: one engine
    ]
)
