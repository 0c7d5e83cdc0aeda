"""The block ledger: every block life (stored -> removed) of one KV cache, from its events.

Built from the engine's KV events in publish order (finalize.provenance reads it). A block's
prefix key is its own tokens chained on its parent's key, the same chaining the engines hash
with (finalize.blockhash), so a request's k-th full block of prompt tokens has the same key as
a stored block exactly when the whole prefix up to it is identical. A block stored on a parent
never seen has no key (an orphan); a partial block, one of another size or one chained on such
a block can never equal a prompt's (unmatchable).

The lives are columns (numpy arrays, lists of shared strings), not an object per life: at 200k
lives, objects and the build's temporaries were ~110 MiB of a 100k-request finalize's peak.
"""

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvscope.finalize import blockhash, heaptrim
from kvscope.finalize.blocktable import CLEARED, EVICTED, REMOVALS, STILL_CACHED
from kvscope.finalize.gcpause import without_gc
from kvscope.records.kv_events import KvBatch, KvEvent

_ROOT = 0
_UNMATCHABLE = -1  # the key of a block no prompt block can equal (a partial or odd-sized chunk)
KEYED, UNMATCHABLE, ORPHAN = range(3)  # Ledger.key_state: a prefix key, -1, None (no parent)


@dataclass(slots=True)
class BlockLife:
    """One block life as an object: what Ledger.lives gives (finalize.routing reads it)."""

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
        """The lives as BlockLife objects, made on each call (finalize.routing reads their key,
        stored_ns and removed_ns). Provenance's results per life (owner, hits, needed) are in
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


class _Columns:
    """The ledger's columns while it is built: one machine word a value (array.array)."""

    def __init__(self) -> None:
        self.block_hash, self.tokens = array("q"), array("q")
        self.stored_ns, self.seq, self.removed_ns = array("q"), array("q"), array("q")
        self.key, self.key_state, self.removal = array("Q"), array("b"), array("b")
        self.session_id: list[str | None] = []

    def append(
        self, h: int, key: int | None, tokens: int, ts: int, seq: int, sid: str | None
    ) -> int:
        """Add a life still cached; its index."""
        self.block_hash.append(h)
        self.key.append(0 if key is None or key == _UNMATCHABLE else key)
        self.key_state.append(ORPHAN if key is None else UNMATCHABLE if key < 0 else KEYED)
        self.tokens.append(tokens)
        self.stored_ns.append(ts)
        self.seq.append(seq)
        self.removed_ns.append(0)
        self.removal.append(STILL_CACHED)
        self.session_id.append(sid)
        return len(self.session_id) - 1

    def key_of(self, life: int | None) -> int | None:
        """The prefix key of a life as build_ledger chains it (-1 unmatchable, None orphan)."""
        if life is None or self.key_state[life] == ORPHAN:
            return None
        return self.key[life] if self.key_state[life] == KEYED else _UNMATCHABLE

    def remove(self, life: int, ts: int, how: int) -> None:
        self.removed_ns[life], self.removal[life] = ts, how


@without_gc
def build_ledger(events: Iterable[tuple[KvBatch, KvEvent]]) -> Ledger:
    """Block lives from (batch, event) pairs in publish order (read_batches + events_of)."""
    events = list(events)
    which, flat, bounds = _stored_hashes(events)
    col = _Columns()
    alive: dict[int, int] = {}  # block hash -> its life in the cache now
    block_size: int | None = None
    orphans, w = 0, 0  # w: the next of `which`
    first_store: dict[int, str] = {}  # seq -> the first session_id stored in that step
    removed_in = array("q")  # (life, seq) of each eviction, flat
    for n, (batch, e) in enumerate(events):
        ts, seq = batch.ts_ns, batch.seq
        if e.kind == "stored":
            size = e.block_size or block_size
            block_size = block_size or size
            while w < len(which) and which[w] < n:
                w += 1
            if size is None:
                continue
            mine: list[int] = []
            if w < len(which) and which[w] == n:
                mine = flat[bounds[w] : bounds[w + 1]].tolist()
            parent = e.parent_block_hash
            key = _ROOT if parent is None else col.key_of(alive.get(parent))
            n_tokens = len(e.token_ids)
            mult = blockhash.multiplier(size)  # key = chain(key, hash, size), inlined
            for i, h in enumerate(e.block_hashes):
                tokens = max(min(size, n_tokens - i * size), 0)
                if key is not None:
                    full = i < len(mine) and key != _UNMATCHABLE
                    key = (key * mult + mine[i]) & blockhash.MASK if full else _UNMATCHABLE
                orphans += key is None
                alive[h] = col.append(h, key, tokens, ts, seq, e.session_id)
            if e.session_id:
                first_store.setdefault(seq, e.session_id)
        elif e.kind == "removed":
            for h in e.block_hashes:
                life = alive.pop(h, None)
                if life is not None:
                    col.remove(life, ts, EVICTED)
                    removed_in.extend((life, seq))
        else:  # cleared: the whole cache was reset, nobody evicted anything
            for life in alive.values():
                col.remove(life, ts, CLEARED)
            alive.clear()
    evictor: list[str | None] = [None] * len(col.session_id)
    for life, seq in zip(removed_in[::2], removed_in[1::2], strict=True):
        evictor[life] = first_store.get(seq)
    del events, flat, alive, first_store, removed_in
    heaptrim.release()
    return Ledger(
        *(np.asarray(getattr(col, c)) for c in ("block_hash", "key", "key_state", "tokens")),
        *(np.asarray(getattr(col, c)) for c in ("stored_ns", "seq", "removed_ns", "removal")),
        col.session_id, evictor, block_size, orphans,
    )  # fmt: skip


def _stored_hashes(
    events: Sequence[tuple[KvBatch, KvEvent]],
) -> tuple[list[int], np.ndarray, list[int]]:
    """(which, hashes, bounds): the stored events (indices, ascending) with full blocks of the
    ledger's block size, and the hashes of those blocks, flat: event which[j]'s are
    hashes[bounds[j] : bounds[j + 1]], hashed in one batch.

    The ledger's block size is the first stored event's that has one; an event of another size
    gets none (its blocks can never match a prompt's)."""
    size = next((e.block_size for _, e in events if e.kind == "stored" and e.block_size), None)
    if size is None:
        return [], np.zeros(0, dtype=np.uint64), [0]
    which = [
        n for n, (_, e) in enumerate(events)
        if e.kind == "stored" and e.block_size in (None, size) and len(e.token_ids) >= size
    ]  # fmt: skip
    chunks = []
    for n in which:
        e = events[n][1]
        chunks.append(e.token_ids[: min(len(e.token_ids) // size, len(e.block_hashes)) * size])
    _, flat, offsets = blockhash.prompt_blocks(chunks, size)
    return which, flat, offsets.tolist()
