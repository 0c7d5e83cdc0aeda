"""A KV cache's event stream as finalize reads it: flat columns, no object per batch or event.

kv_events.read_batches gives a KvBatch and a KvEvent per batch and event, each with its token
ids as Python ints. Finalize needs the token ids only to hash the stored blocks
(records.blockkey), so `read_columns` reads the stream (kv_events.arrow) a few MB of record
batches at a time as Arrow columns: the token ids stay one flat numpy array, its full blocks are
hashed and only the hashes kept. What is left is one entry per event and one per row of
kv_events.parquet (one per block event). An older run's kv_events.jsonl is read as KvBatch
objects (read_batches: such streams are small) and given the same columns.

`columns_of` gives the same columns from KvBatch objects; `events_table` is
kv_events.parquet from the columns; finalize.ledger builds the block ledger from them.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvscope.records import blockkey
from kvscope.records.base import ArrowBatches
from kvscope.records.formats import is_arrow_stream
from kvscope.records.kv_events import (
    BATCHES_SCHEMA,
    EVENTS_SCHEMA,
    LIVE,
    REPLAY,
    missing_seqs,
    read_batches,
)

if TYPE_CHECKING:
    from kvscope.records.kv_events import KvBatch, KvEvent

KINDS = ("stored", "removed", "cleared")  # KvColumns.kind's codes, in order
STORED, REMOVED, CLEARED = range(3)
# the stream's batch struct, with token ids of any 64-bit value (columns_of's KvBatch objects)
_BATCH = pa.struct(
    [f if f.name != "events" else pa.field("events", pa.list_(pa.struct(
        [e if e.name != "token_ids" else pa.field("token_ids", pa.list_(pa.int64()))
         for e in BATCHES_SCHEMA.field("events").type.value_type]
    ))) for f in BATCHES_SCHEMA]
)  # fmt: skip
_CHUNK_BYTES = 8 << 20  # record batches read at once: ~20k KV batches of a 100k-call run


@dataclass(frozen=True)
class KvColumns:
    """One KV cache's event stream in publish order: its batches by seq (ties in the order
    read), each batch's events as listed. One entry per event in the event columns; one per
    row of kv_events.parquet in the row columns: a stored or removed event has a row per block,
    a cleared event one row (block hash 0 here, null in the table). Event i's rows are
    first_row[i] : first_row[i + 1]."""

    seq: np.ndarray  # int64, per event: its batch's seq
    ts_ns: np.ndarray  # int64: its batch's publish time (the engine's clock)
    received_ns: pa.Array  # int64: when its batch was received; null if never said
    source: pa.Array  # string: its batch's, live | replay
    kind: np.ndarray  # int8: STORED | REMOVED | CLEARED
    parent_block_hash: np.ndarray  # int64: a stored event's first block's parent, where has_parent
    has_parent: np.ndarray  # bool
    block_size: np.ndarray  # int64: 0 where the event gives none
    n_tokens: np.ndarray  # int64: how many token ids the event carries
    session_id: pa.Array  # string
    medium: pa.Array  # string
    first_row: np.ndarray  # int64, one entry more than events
    block_hash: np.ndarray  # int64, per row
    # per row: the block's own hash (blockkey.prompt_blocks' `hashes`) where `hashed`: a full
    # block (its tokens all carried) of its event's block size, or of the stream's `ledger_size`
    # for an event that gives none
    own_hash: np.ndarray  # uint64
    hashed: np.ndarray  # bool
    ledger_size: int | None  # the first stored event's block size (of those that give one)
    batches: int  # batches read
    missing: int  # seqs missing between the first and last batch read
    recovered: int  # batches that came from the engine's replay socket
    torn: int  # torn records left off (a write cut short)

    def __len__(self) -> int:
        return len(self.kind)


def read_columns(path: Path) -> KvColumns:
    """A KV event stream (kv_events.arrow, or an older run's kv_events.jsonl) as columns. A torn
    last batch, or a JSONL line that is not a batch (or whose events are of no known kind or
    have ids that are not integers), is left off and counted (`torn`)."""
    if not is_arrow_stream(path):
        batches, torn = read_batches(path)
        readable = [b for b in batches if all(map(_readable, b.events))]
        return _columns(readable, torn + len(batches) - len(readable))
    build, read = _Builder(), ArrowBatches(path)
    for batch in read.chunks(_CHUNK_BYTES):
        build.add(_lines(batch.to_struct_array()))
    if not build.chunks:  # not one batch
        build.add(_lines(pa.array([], type=_BATCH)))
    return build.finish(by_seq=True, torn=read.torn)


def _readable(e: "KvEvent") -> bool:
    """Whether an older JSONL stream's event can be read as columns: a known kind, integer ids
    (a Python int each: such streams are small)."""
    return e.kind in KINDS and all(type(x) is int for x in (*e.block_hashes, *e.token_ids))


@dataclass(frozen=True)
class _Lines:
    """Batches read: as Arrow (the stream's batch struct), and their events' token ids."""

    batches: pa.StructArray
    ids: np.ndarray  # the events' ids laid end to end
    starts: np.ndarray  # int64: where each event's begin in `ids`
    counts: np.ndarray  # int64: how many each event has


def _lines(batches: pa.StructArray) -> _Lines:
    """The batches with their events' token ids as one flat array (no Python int per id)."""
    ids = batches.field("events").flatten().field("token_ids")
    counts = pc.list_value_length(ids).fill_null(0).to_numpy().astype(np.int64)
    return _Lines(batches, pc.list_flatten(ids).to_numpy(), np.cumsum(counts) - counts, counts)


def columns_of(batches: Iterable["KvBatch"]) -> KvColumns:
    """The columns of batches in the order given (read_batches gives them in seq order); a
    ValueError for an event of no known kind."""
    return _columns(batches, torn=0)


def _columns(batches: Iterable["KvBatch"], torn: int) -> KvColumns:
    dicts = [vars(b) | {"events": [vars(e) for e in b.events]} for b in batches]
    build = _Builder()
    build.add(_lines(pa.array(dicts, type=_BATCH)))
    return build.finish(by_seq=False, torn=torn)


class _Builder:
    """KvColumns' columns as the stream is read, a chunk at a time and in the order read; of the
    events' token ids only their full blocks' hashes are kept."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[Any]] = {}  # column -> its chunks (numpy or Arrow)
        self.batches, self.events, self.rows = 0, 0, 0
        self.hashed_rows: list[np.ndarray] = []  # rows (as read) and their own hashes
        self.hashes: list[np.ndarray] = []
        self.unsized: list[tuple[int, np.ndarray]] = []  # (event, ids): hashed once size is known

    def add(self, lines: _Lines) -> None:
        """The next batches read."""
        arr = lines.batches
        nested = arr.field("events")
        per = np.diff(nested.offsets.to_numpy())
        events = nested.flatten()
        codes = pc.index_in(events.field("kind"), pa.array(KINDS))
        if codes.null_count:
            raise ValueError(f"an event of a kind not in {KINDS}")
        kind = codes.to_numpy().astype(np.int8)
        hashes = events.field("block_hashes")
        lengths = pc.list_value_length(hashes).fill_null(0).to_numpy()
        rows = np.where(kind == CLEARED, 1, lengths)
        first = np.cumsum(rows) - rows  # in this chunk
        of = np.repeat(np.arange(len(kind)), lengths)  # each hash's event
        keep = kind[of] != CLEARED  # a cleared event's row has no block
        block_hash = np.zeros(int(rows.sum()), dtype=np.int64)
        at = first[of] + np.arange(len(of)) - (np.cumsum(lengths) - lengths)[of]
        block_hash[at[keep]] = hashes.flatten().to_numpy()[keep]
        parent = events.field("parent_block_hash")
        size = events.field("block_size").fill_null(0).to_numpy()
        self._put(
            seq=arr.field("seq").to_numpy(), ts_ns=arr.field("ts_ns").to_numpy(),
            received_ns=_copy(arr.field("received_ns")),
            source=_copy(arr.field("source").fill_null(LIVE)),
            batch_of=np.repeat(np.arange(self.batches, self.batches + len(arr)), per),
            kind=kind, block_size=size, n_tokens=lines.counts, rows=rows,
            parent_block_hash=parent.fill_null(0).to_numpy(),
            has_parent=parent.is_valid().to_numpy(zero_copy_only=False),
            session_id=_copy(events.field("session_id")), medium=_copy(events.field("medium")),
            block_hash=block_hash,
        )  # fmt: skip
        self._hash_chunk(kind, size, lines, first + self.rows, rows)
        self.batches, self.events = self.batches + len(arr), self.events + len(kind)
        self.rows += len(block_hash)

    def _put(self, **columns: Any) -> None:
        for name, values in columns.items():
            self.chunks.setdefault(name, []).append(values)

    def _hash_chunk(
        self, kind: np.ndarray, size: np.ndarray, lines: _Lines, first: np.ndarray, rows: np.ndarray
    ) -> None:
        """Hash the stored events' full blocks (keep the ids of events of no block size)."""
        n, ids = lines.counts, lines.ids
        starts = lines.starts.tolist()
        stored = (kind == STORED) & (rows > 0)
        for e in np.flatnonzero(stored & (size == 0) & (n > 0)).tolist():
            self.unsized.append((self.events + e, ids[starts[e] : starts[e] + n[e]].copy()))
        hashable = stored & (size > 0) & (n >= size)
        for s in np.unique(size[hashable]).tolist():
            which = np.flatnonzero(hashable & (size == s))
            mine = [ids[starts[e] : starts[e] + n[e]] for e in which.tolist()]
            self._hash(mine, first[which], rows[which], s)

    def _hash(self, ids: list[np.ndarray], row: np.ndarray, rows: np.ndarray, size: int) -> None:
        """Hash each event's full blocks of `size` (one per row at most): event i has `ids[i]`,
        and rows[i] rows from row[i] on."""
        counts = np.minimum([len(x) // size for x in ids], rows)
        blocks = [x[: c * size] for x, c in zip(ids, counts.tolist(), strict=True)]
        _, hashes, offsets = blockkey.prompt_blocks(blocks, size)
        self.hashed_rows.append(np.repeat(row - offsets[:-1], counts) + np.arange(len(hashes)))
        self.hashes.append(hashes)

    def finish(self, by_seq: bool, torn: int) -> KvColumns:
        """The columns; `by_seq`: batches in seq order (stable), else as read."""
        col = {
            k: np.concatenate(v) if isinstance(v[0], np.ndarray) else pa.concat_arrays(v)
            for k, v in self.chunks.items()
        }
        seq, batch_of, kind, size = col["seq"], col["batch_of"], col["kind"], col["block_size"]
        first_row = np.zeros(len(kind) + 1, dtype=np.int64)
        np.cumsum(col["rows"], out=first_row[1:])
        order = np.arange(len(kind))  # events in publish order, as indices into those read
        if by_seq and (np.diff(seq) < 0).any():
            rank = np.empty_like(seq)
            rank[np.argsort(seq, kind="stable")] = np.arange(len(seq))
            order = np.argsort(rank[batch_of], kind="stable")
        sized = np.flatnonzero((kind[order] == STORED) & (size[order] > 0))
        ledger_size = int(size[order[sized[0]]]) if len(sized) else None
        if ledger_size and self.unsized:
            which = np.array([e for e, _ in self.unsized])
            mine = [x for _, x in self.unsized]
            self._hash(mine, first_row[which], col["rows"][which], ledger_size)
        own_hash = np.zeros(self.rows, dtype=np.uint64)
        hashed = np.zeros(self.rows, dtype=bool)
        for rows, hashes in zip(self.hashed_rows, self.hashes, strict=True):
            own_hash[rows], hashed[rows] = hashes, True
        counts = col["rows"][order]
        new_first = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(counts, out=new_first[1:])
        rows = np.repeat(first_row[order] - new_first[:-1], counts) + np.arange(self.rows)
        batch = batch_of[order]
        seqs = np.unique(seq)
        return KvColumns(
            seq=seq[batch], ts_ns=col["ts_ns"][batch],
            received_ns=col["received_ns"].take(batch), source=col["source"].take(batch),
            kind=kind[order], parent_block_hash=col["parent_block_hash"][order],
            has_parent=col["has_parent"][order], block_size=size[order],
            n_tokens=col["n_tokens"][order], session_id=col["session_id"].take(order),
            medium=col["medium"].take(order), first_row=new_first,
            block_hash=col["block_hash"][rows], own_hash=own_hash[rows], hashed=hashed[rows],
            ledger_size=ledger_size, batches=len(seq),
            missing=missing_seqs(seqs),
            recovered=pc.sum(pc.equal(col["source"], REPLAY)).as_py() or 0, torn=torn,
        )  # fmt: skip


def _copy(values: pa.Array) -> pa.Array:
    """`values` in buffers of their own (a field of a struct array shares the struct's)."""
    return pa.concat_arrays([values, pa.nulls(0, values.type)])


def events_table(c: KvColumns, replica: str | None = None) -> pa.Table:
    """kv_events.parquet: one row per block event (a BlockStored of 4 blocks gives 4 rows, a
    cleared event one with no block); `replica`: the deployment replica that published them
    (None: one engine)."""
    event = np.repeat(np.arange(len(c)), np.diff(c.first_row))
    at = np.arange(len(event)) - c.first_row[event]  # the block's place in its event
    kind, size = c.kind[event], c.block_size[event]
    stored = kind == STORED
    parent = np.where(at == 0, c.parent_block_hash[event], np.roll(c.block_hash, 1))
    tokens = np.clip(c.n_tokens[event] - at * size, 0, size).astype(np.int32)
    take = pa.array(event)
    columns = [
        pa.array(c.seq[event]), pa.array(c.ts_ns[event]), c.received_ns.take(take),
        c.source.take(take), pa.array(KINDS).take(pa.array(kind)),
        pa.array(c.block_hash, mask=kind == CLEARED),
        pa.array(parent, mask=~stored | ((at == 0) & ~c.has_parent[event])),
        pa.array(tokens, mask=~stored), c.session_id.take(take), c.medium.take(take),
        pa.repeat(pa.scalar(replica, pa.string()), len(event)),
    ]  # fmt: skip
    return pa.Table.from_arrays(columns, schema=EVENTS_SCHEMA)
