"""The KV event stream: every event batch the engine published, as received (kv_events.jsonl), one
row per block event (kv_events.parquet), and the listener's own account (kv_events.summary.json).

Events are BlockStored / BlockRemoved / AllBlocksCleared, in kvscope's words "stored", "removed",
"cleared"; block hashes are signed 64-bit ints whatever the engine sent.
"""

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from kvscope.records.base import read_jsonl, record_dict

KV_EVENTS_JSONL = "kv_events.jsonl"
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


def read_batches(path: Path) -> tuple[list[KvBatch], int]:
    """The stream's batches in seq order, and how many torn lines were skipped (finalize reads a
    large run's stream as columns instead: finalize.kvcolumns)."""
    batches, bad = read_jsonl(path, KvBatch.from_dict)
    return sorted(batches, key=lambda b: b.seq), bad


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
