"""The block ledger: every block life (stored -> removed) of one KV cache, from its events.

Built from the engine's KV events in publish order (finalize.provenance reads it). A block's
prefix key is its own tokens chained on its parent's key, the same chaining the engines hash
with (records.blockkey), so a request's k-th full block of prompt tokens has the same key as
a stored block exactly when the whole prefix up to it is identical. A block stored on a parent
never seen has no key (an orphan); a partial block, one of another size or one chained on such
a block can never equal a prompt's (unmatchable).

The lives are columns (numpy arrays, lists of shared strings), not an object per life: at 200k
lives, objects and the build's temporaries were ~110 MiB of a 100k-request finalize's peak.
"""

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import groupby

import numpy as np

from kvscope.finalize.blocktable import CLEARED, EVICTED, REMOVALS, STILL_CACHED
from kvscope.finalize.kvcolumns import REMOVED, STORED, KvColumns, columns_of
from kvscope.records import blockkey
from kvscope.records.kv_events import KvBatch, KvEvent

_ROOT = 0
_UNMATCHABLE = -1  # the key of a block no prompt block can equal (a partial or odd-sized chunk)
KEYED, UNMATCHABLE, ORPHAN = range(3)  # Ledger.key_state: a prefix key, -1, None (no parent)


@dataclass(slots=True)
class BlockLife:
    """One block life as an object: what Ledger.lives gives (finalize.routing_misses reads it)."""

    block_hash: int
    key: int | None  # prefix key; None when the parent was never seen
    tokens: int
    stored_ns: int
    seq: int
    session_id: str | None
    owner: str | None = None  # request_uuid
    attribution: str | None = None  # "session_id" | "tokens"
    removed_ns: int | None = None
    removal: str | None = None  # "evicted" | "cleared"
    evictor: str | None = None
    evictor_method: str | None = None  # how it was inferred
    hits: int = 0  # requests served by this life
    needed_by: str | None = None  # the first request that recomputed it after it was removed
    needed: int = 0  # how many requests did


@dataclass(frozen=True)
class Ledger:
    """Block lives (stored -> removed) in ledger order, as columns: one entry per life in each.

    Flat arrays, not an object per life (at 200k lives the objects and their build were ~110 MiB
    of a 100k-request finalize's peak). A life's prefix key is `key` where key_state is KEYED;
    UNMATCHABLE lives (a partial or odd-sized block) have key -1 in BlockLife terms, ORPHAN ones
    (stored on a parent never seen) None. Provenance reads the ledger and never changes it."""

    block_hash: np.ndarray  # int64
    key: np.ndarray  # uint64: the prefix key, where key_state is KEYED (else 0)
    key_state: np.ndarray  # int8: KEYED | UNMATCHABLE | ORPHAN
    tokens: np.ndarray  # int64: the block's tokens (< block_size for a partial block)
    stored_ns: np.ndarray  # int64: the storing batch's ts_ns
    seq: np.ndarray  # int64: the storing batch's seq
    removed_ns: np.ndarray  # int64: the removing batch's ts_ns; 0 while still cached
    removal: np.ndarray  # int8: a blocktable.REMOVALS code (STILL_CACHED, EVICTED, CLEARED)
    session_id: list[str | None]  # the storing event's session_id
    evictor: list[str | None]  # an evicted life's first session_id stored in the removing step
    block_size: int | None
    orphan_blocks: int  # stored with a parent never seen: no prefix key, never matched

    def __len__(self) -> int:
        return len(self.block_hash)

    @property
    def lives(self) -> list[BlockLife]:
        """The lives as BlockLife objects, made on each call (finalize.routing_misses reads their
        key, stored_ns and removed_ns). Provenance's results per life (owner, hits, needed) are in
        its block table, not here: they are left unset."""
        keys = [
            k if s == KEYED else (_UNMATCHABLE if s == UNMATCHABLE else None)
            for k, s in zip(self.key.tolist(), self.key_state.tolist(), strict=True)
        ]
        columns = (self.block_hash, self.tokens, self.stored_ns, self.seq, self.removed_ns)
        out = []
        for i, (h, n, t, seq, gone) in enumerate(zip(*(c.tolist() for c in columns), strict=True)):
            life = BlockLife(h, keys[i], n, t, seq, self.session_id[i])
            if self.removal[i] != STILL_CACHED:
                life.removed_ns, life.removal = gone, REMOVALS[self.removal[i]]
            if self.evictor[i] is not None:
                life.evictor, life.evictor_method = self.evictor[i], "same-step store"
            out.append(life)
        return out


def build_ledger(events: Iterable[tuple[KvBatch, KvEvent]]) -> Ledger:
    """Block lives from (batch, event) pairs in publish order (read_batches + events_of)."""
    batches = []  # consecutive pairs of one batch object: that batch with those events
    for _, group in groupby(events, key=lambda pair: id(pair[0])):
        pairs = list(group)
        batches.append(replace(pairs[0][0], events=tuple(e for _, e in pairs)))
    return ledger_of(columns_of(batches))


def ledger_of(c: KvColumns) -> Ledger:
    """Block lives from a stream's columns (kvcolumns.read_columns), in publish order.

    The ledger's block size is the first stored event's that gives one (`c.ledger_size`): the
    stored events before it have no lives; a later one that gives no size has that size. A
    block chains on its parent's life cached at the time (the event's parent for its first
    block, the block before it for the others): its key is the root's for no parent, none (an
    orphan) for a parent not cached, unmatchable for a block not full, of another size or
    chained on an unmatchable one. A removed block ends its life cached then, a cleared event
    all of them; an evicted life's evictor is the first session_id stored in the removing
    batch's seq."""
    size = c.ledger_size
    row_event = np.repeat(np.arange(len(c)), np.diff(c.first_row))
    sized = np.flatnonzero((c.kind == STORED) & (c.block_size > 0))
    start = int(sized[0]) if len(sized) else len(c)  # the first event with lives
    rows = np.flatnonzero((c.kind[row_event] == STORED) & (row_event >= start))  # one a life
    event = row_event[rows]
    sizes = np.where(c.block_size > 0, c.block_size, size or 0)  # each event's block size
    full = c.hashed & (sizes[row_event] == size)  # rows whose own hash extends a key
    sids = c.session_id.to_pylist()  # one str per event, shared by its lives
    chain = _chain(c, start, sizes, full, sids)
    removed_ns = np.zeros(len(rows), dtype=np.int64)
    removal = np.full(len(rows), STILL_CACHED, dtype=np.int8)
    ended = np.asarray(chain.ended, dtype=np.int64)
    by = np.asarray(chain.ended_by, dtype=np.int64)
    removed_ns[ended], removal[ended] = c.ts_ns[by], np.asarray(chain.how, dtype=np.int8)
    evictor: list[str | None] = [None] * len(rows)
    evicted = removal[ended] == EVICTED
    for life, seq in zip(ended[evicted].tolist(), c.seq[by[evicted]].tolist(), strict=True):
        evictor[life] = chain.first_store.get(seq)
    at = rows - c.first_row[event]  # the block's place in its event
    tokens = np.clip(c.n_tokens[event] - at * sizes[event], 0, sizes[event])
    del row_event, full
    return Ledger(
        c.block_hash[rows], np.asarray(chain.key), np.asarray(chain.key_state), tokens,
        c.ts_ns[event], c.seq[event], removed_ns, removal,
        [sids[n] for n in event.tolist()], evictor, size, chain.orphans,
    )  # fmt: skip


@dataclass(frozen=True)
class _Chain:
    """What the walk through the events (_chain) gives: per life its key, and the lives ended,
    by which event and how."""

    key: array  # "Q"
    key_state: array  # "b"
    ended: array  # "q": lives
    ended_by: array  # "q": the event that ended each
    how: array  # "b": EVICTED | CLEARED
    first_store: dict[int, str]  # seq -> the first session_id stored in that step
    orphans: int


def _chain(
    c: KvColumns, start: int, sizes: np.ndarray, full: np.ndarray, sids: list[str | None]
) -> _Chain:
    """The lives' keys and ends, walking the events from `start` in publish order."""
    key, key_state = array("Q"), array("b")
    ended, ended_by, how = array("q"), array("q"), array("b")
    first_store: dict[int, str] = {}
    alive: dict[int, int] = {}  # block hash -> its life in the cache now
    life, orphans = 0, 0
    block_hash, own, is_full = c.block_hash.tolist(), c.own_hash.tolist(), full.tolist()
    first_row, kinds, seqs = c.first_row.tolist(), c.kind.tolist(), c.seq.tolist()
    parents, has_parent = c.parent_block_hash.tolist(), c.has_parent.tolist()
    block_sizes = sizes.tolist()
    for n in range(start, len(kinds)):
        rows = range(first_row[n], first_row[n + 1])
        if kinds[n] == STORED:
            k: int | None = _ROOT  # the chain's key so far; -1 unmatchable, None orphan
            if has_parent[n]:
                p = alive.get(parents[n])
                state = ORPHAN if p is None else key_state[p]
                k = key[p] if state == KEYED else _UNMATCHABLE if state == UNMATCHABLE else None
            mult = blockkey.multiplier(block_sizes[n])
            for r in rows:
                if k is None:
                    orphans += 1
                    key.append(0)
                    key_state.append(ORPHAN)
                elif is_full[r] and k != _UNMATCHABLE:
                    k = (k * mult + own[r]) & blockkey.MASK
                    key.append(k)
                    key_state.append(KEYED)
                else:
                    k = _UNMATCHABLE
                    key.append(0)
                    key_state.append(UNMATCHABLE)
                alive[block_hash[r]] = life
                life += 1
            if sids[n]:
                first_store.setdefault(seqs[n], sids[n])
        elif kinds[n] == REMOVED:
            for r in rows:
                gone = alive.pop(block_hash[r], None)
                if gone is not None:
                    ended.append(gone)
                    ended_by.append(n)
                    how.append(EVICTED)
        else:  # cleared: the whole cache was reset, nobody evicted anything
            ended.extend(alive.values())
            ended_by.extend([n] * len(alive))
            how.extend([CLEARED] * len(alive))
            alive.clear()
    return _Chain(key, key_state, ended, ended_by, how, first_store, orphans)
