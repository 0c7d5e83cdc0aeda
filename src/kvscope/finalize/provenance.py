"""Cache provenance from the engine's KV events: who stored each block, who reused it, who lost it.

A ledger of block lives (stored -> removed) is built from the events in publish order. Blocks
are matched to prompts by their prefix: a block's key is its own tokens chained on its parent's
key, the same chaining the engines hash with, so a request's k-th full block of prompt tokens has
the same key as a stored block exactly when the whole prefix up to it is identical.

Attribution of a stored block to a request uses the event's session_id (kvscope sends the
request_uuid) and otherwise the in-flight request whose prompt holds that prefix. The evictor of
a removed block is inferred, never observed (engines publish no cause): the requests whose new
blocks were stored in the same scheduler step, else the request that started last among those
in flight. Both are marked as inferred in the output.

Uncached blocks are evicted (every earlier life of the key was removed by then), cold (a prompt
that started earlier holds the same prefix: it was still being computed) or layout (a prompt
that started earlier held the block's tokens at any offset, behind another prefix), else cold.
Keys and hashes come from finalize.blockhash (numpy); the layout check is answered for all
requests at once after the pass, keeping only the windows whose hash some check asks for.
"""

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from kvscope.finalize import blockhash, keylives
from kvscope.finalize.blockhash import Tokens
from kvscope.finalize.blocktable import block_table
from kvscope.finalize.gcpause import without_gc
from kvscope.finalize.keylives import KeyLives
from kvscope.records.kv_events import KvBatch, KvEvent
from kvscope.records.requests import STATUS_OK

_ROOT = 0
_UNMATCHABLE = -1  # the key of a block no prompt block can equal (a partial or odd-sized chunk)

Row = dict[str, Any]


@dataclass(slots=True)
class BlockLife:
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
    lives: list[BlockLife]
    block_size: int | None
    orphan_blocks: int  # stored with a parent never seen: no prefix key, never matched


@without_gc
def build_ledger(events: Iterable[tuple[KvBatch, KvEvent]]) -> Ledger:
    """Block lives from (batch, event) pairs in publish order (read_batches + events_of)."""
    events = list(events)
    hashes = _stored_hashes(events)
    lives: list[BlockLife] = []
    alive: dict[int, BlockLife] = {}
    block_size: int | None = None
    orphans = 0
    step_stores: dict[int, list[str]] = defaultdict(list)  # seq -> session_ids stored then
    removed_in: list[tuple[BlockLife, int]] = []
    for n, (batch, e) in enumerate(events):
        ts, seq = batch.ts_ns, batch.seq
        if e.kind == "stored":
            size = e.block_size or block_size
            block_size = block_size or size
            if size is None:
                continue
            parent = e.parent_block_hash
            key: int | None = _ROOT if parent is None else _key_of(alive, parent)
            mine, n_tokens = hashes.get(n, []), len(e.token_ids)
            mult = blockhash.multiplier(size)  # key = chain(key, hash, size), inlined
            for i, h in enumerate(e.block_hashes):
                tokens = max(min(size, n_tokens - i * size), 0)
                if key is not None:
                    full = i < len(mine) and key != _UNMATCHABLE
                    key = (key * mult + mine[i]) & blockhash.MASK if full else _UNMATCHABLE
                orphans += key is None
                life = BlockLife(h, key, tokens, ts, seq, e.session_id)
                alive[h] = life
                lives.append(life)
            if e.session_id:
                step_stores[seq].append(e.session_id)
        elif e.kind == "removed":
            for h in e.block_hashes:
                life = alive.pop(h, None)
                if life is not None:
                    life.removed_ns, life.removal = ts, "evicted"
                    removed_in.append((life, seq))
        else:  # cleared: the whole cache was reset, nobody evicted anything
            for life in alive.values():
                life.removed_ns, life.removal = ts, "cleared"
            alive.clear()
    first_store = {seq: stores[0] for seq, stores in step_stores.items()}  # all non-empty
    for life, seq in removed_in:
        if seq in first_store:
            life.evictor, life.evictor_method = first_store[seq], "same-step store"
    return Ledger(lives, block_size, orphans)


def _stored_hashes(events: Sequence[tuple[KvBatch, KvEvent]]) -> dict[int, list[int]]:
    """Event index -> the hashes of its full blocks of the ledger's block size, in one batch.

    The ledger's block size is the first stored event's that has one; an event of another size
    gets none (its blocks can never match a prompt's)."""
    size = next((e.block_size for _, e in events if e.kind == "stored" and e.block_size), None)
    if size is None:
        return {}
    which = [
        n for n, (_, e) in enumerate(events)
        if e.kind == "stored" and e.block_size in (None, size) and len(e.token_ids) >= size
    ]  # fmt: skip
    chunks = []
    for n in which:
        e = events[n][1]
        chunks.append(e.token_ids[: min(len(e.token_ids) // size, len(e.block_hashes)) * size])
    _, flat, offsets = blockhash.prompt_blocks(chunks, size)
    flat_list, bounds = flat.tolist(), offsets.tolist()
    return {n: flat_list[bounds[j] : bounds[j + 1]] for j, n in enumerate(which)}


def _key_of(alive: Mapping[int, BlockLife], parent: int) -> int | None:
    life = alive.get(parent)
    return None if life is None else life.key


@dataclass(frozen=True)
class Provenance:
    rows: list[Row]  # the request rows with the provenance columns filled
    table: pa.Table  # the block table (records.blocks.BLOCKS_SCHEMA), one row per block life
    skipped: dict[str, int]  # requests left null, by reason
    queue_unknown: int = 0  # requests classified at their send time: no queue time reported

    @property
    def blocks(self) -> list[Row]:
        """The block table as one dict per block life (records.blocks.BlockRecord.to_dict())."""
        return self.table.to_pylist()


@dataclass(frozen=True)
class _Prompts:
    """The prompts with tokens, in start order, as flat block arrays (blockhash.prompt_blocks)."""

    listed: list[Tokens]  # their token ids
    position: list[int]  # index in the start order of each prompt
    keys: np.ndarray  # chained prefix keys, flat (uint64: 8 bytes a block, not a Python int)
    hashes: np.ndarray  # the blocks' own hashes, flat
    offsets: list[int]  # prompt j's blocks are [offsets[j], offsets[j + 1])
    seen_before: np.ndarray  # bool: a prompt that started earlier holds the same prefix key


def _prompts(order: Sequence[Row], tokens: Mapping[str, Tokens], size: int) -> _Prompts:
    position = [p for p, r in enumerate(order) if tokens.get(r["request_uuid"]) is not None]
    listed = [tokens[order[p]["request_uuid"]] for p in position]
    keys, hashes, offsets = blockhash.prompt_blocks(listed, size)
    holder = np.repeat(np.arange(len(listed)), np.diff(offsets))
    uniq, inverse = np.unique(keys, return_inverse=True)
    first = np.full(len(uniq), len(listed), dtype=np.int64)
    np.minimum.at(first, inverse, holder)
    seen = first[inverse.ravel()] < holder
    return _Prompts(listed, position, keys, hashes, offsets.tolist(), seen)


@without_gc
def provenance(
    rows: Sequence[Row], tokens: Mapping[str, Tokens], ledger: Ledger, replica: str | None = None
) -> Provenance:
    """Per-request provenance columns and the block table (owners, evictors, harm): `rows` the
    calls one cache served, `ledger` that cache's blocks (`replica`: its name in a deployment)."""
    size = ledger.block_size
    by_uuid = {r["request_uuid"]: r for r in rows}
    skipped: dict[str, int] = defaultdict(int)
    if size is None:
        empty = block_table([], by_uuid, replica)
        return Provenance(list(rows), empty, {"no stored blocks": len(rows)})
    order = sorted(rows, key=lambda r: r["start_ns"])
    prompts = _prompts(order, tokens, size)
    _attribute_owners(ledger, order, prompts)
    _infer_evictors(ledger, order, by_uuid)
    by_key = keylives.by_key((x.key, x) for x in ledger.lives if x.key is not None)
    asks: list[int] = []  # flat blocks to look for in earlier prompts' windows
    asker: list[int] = []  # the index in `done` of the request asking
    done: list[tuple[Row, dict[str, int]]] = []
    j = 0
    for p, r in enumerate(order):
        ids = tokens.get(r["request_uuid"])
        reason = _unusable(r, ids)
        if reason is None:
            while prompts.position[j] != p:
                j += 1
            lo, hi = prompts.offsets[j], prompts.offsets[j + 1]
            counts, mine = _classify(r, prompts, lo, hi, by_key, by_uuid, size)
            asker.extend([len(done)] * len(mine))
            asks.extend(mine)
            done.append((r, counts))
        else:
            skipped[reason] += 1
    del by_key  # the per-pass state is freed before the block table is built: a lower peak
    layout = _layout_blocks(prompts, size, asks, asker, len(done))
    del prompts, asks, asker
    out = {r["request_uuid"]: r | _columns(r, c, layout[n] * size) for n, (r, c) in enumerate(done)}
    del layout
    result = [out.get(r["request_uuid"], r) for r in rows]
    unknown = sum(r.get("queue_ms") is None for r, _ in done)
    del out, done
    table = block_table(ledger.lives, by_uuid, replica)
    return Provenance(result, table, dict(skipped), unknown)


def _layout_blocks(
    prompts: _Prompts, size: int, asks: list[int], asker: list[int], n: int
) -> list[int]:
    """Per request, its blocks whose tokens an earlier prompt held at another offset."""
    if not asks:
        return [0] * n
    flat = np.array(asks, dtype=np.int64)
    holder = np.searchsorted(np.array(prompts.offsets), flat, side="right") - 1
    first = blockhash.first_windows(prompts.listed, size, prompts.hashes[flat])
    found = first < holder
    return np.bincount(np.array(asker)[found], minlength=n).tolist()


def _unusable(r: Row, ids: Tokens | None) -> str | None:
    if r["status"] != STATUS_OK:
        return "failed request"
    if ids is None:
        return "no prompt tokens"
    if r.get("cached_tokens") is None or r.get("prompt_tokens") is None:
        return "cached tokens not reported"
    if len(ids) != r["prompt_tokens"]:
        return "kvscope's tokenization differs from the engine's count"
    return None


def admitted_ns(r: Row) -> int:
    """When the engine scheduled the request: its send time plus its server-side queue time.

    An unknown queue time (the engine did not report it) leaves the send time: the earliest the
    request can have been scheduled. Provenance counts such requests (`Provenance.queue_unknown`,
    finalize.json's kv.queue_unknown) rather than calling their queue time 0.
    """
    queue = r.get("queue_ms")
    return r["start_ns"] if queue is None else r["start_ns"] + int(queue * 1e6)


def _classify(
    r: Row,
    prompts: _Prompts,
    lo: int,
    hi: int,
    by_key: Mapping[int, KeyLives[BlockLife]],
    by_uuid: Mapping[str, Row],
    size: int,
) -> tuple[dict[str, int], list[int]]:
    """The cached split and evicted tokens, and the blocks left for the layout check (flat)."""
    cached = r["cached_tokens"]
    keys = prompts.keys[lo:hi].tolist()
    t = admitted_ns(r)
    counts = dict.fromkeys(("self", "cross_agent", "cross_workflow", "unattributed"), 0)
    hit_blocks = min(cached // size, len(keys))
    for i in range(hit_blocks):
        lives = by_key.get(keys[i])
        life = lives.resident(t) if lives else None
        if life is None or life.owner is None or life.owner == r["request_uuid"]:
            counts["unattributed"] += size
            continue
        life.hits += 1
        counts[_relation(r, by_uuid.get(life.owner))] += size
    counts["unattributed"] += cached - hit_blocks * size
    counts["evicted"] = 0
    asks = []
    seen = prompts.seen_before[lo:hi].tolist()
    for i in range(hit_blocks, len(keys)):
        lives = by_key.get(keys[i])
        last = lives.evicted_before(t) if lives else None
        if last is not None:
            last.needed_by = last.needed_by or r["request_uuid"]
            last.needed += 1
            counts["evicted"] += size
        elif not seen[i]:  # else: computed by a request in flight: cold
            asks.append(lo + i)
    return counts, asks


def _columns(r: Row, counts: Mapping[str, int], layout: int) -> Row:
    uncached = max(r["prompt_tokens"] - r["cached_tokens"], 0)
    evicted = min(counts["evicted"], uncached)
    layout = min(layout, max(uncached - evicted, 0))
    return {
        "cached_self_tokens": counts["self"],
        "cached_cross_agent_tokens": counts["cross_agent"],
        "cached_cross_workflow_tokens": counts["cross_workflow"],
        "cached_unattributed_tokens": counts["unattributed"],
        "uncached_evicted_tokens": evicted,
        "uncached_layout_tokens": layout,
        "uncached_cold_tokens": uncached - evicted - layout,
    }


def _relation(r: Row, owner: Row | None) -> str:
    if owner is None:
        return "unattributed"
    if owner["workflow_run_id"] != r["workflow_run_id"]:
        return "cross_workflow"
    return "self" if owner["agent_id"] == r["agent_id"] else "cross_agent"


def _attribute_owners(ledger: Ledger, order: Sequence[Row], prompts: _Prompts) -> None:
    uuids = {r["request_uuid"] for r in order}
    wanted = {x.key for x in ledger.lives if x.session_id not in uuids and x.key is not None}
    holders: dict[int, list[int]] = defaultdict(list)  # key -> start positions holding it
    if wanted:
        for j, p in enumerate(prompts.position):
            for k in prompts.keys[prompts.offsets[j] : prompts.offsets[j + 1]].tolist():
                if k in wanted and (not holders[k] or holders[k][-1] != p):
                    holders[k].append(p)
    starts = [r["start_ns"] for r in order]
    for life in ledger.lives:
        if life.session_id in uuids:
            life.owner, life.attribution = life.session_id, "session_id"
        elif life.key is not None:
            # The earliest-started in-flight request whose prompt holds this prefix.
            bound = bisect_right(starts, life.stored_ns)
            for p in holders.get(life.key, ()):
                if p >= bound:
                    break
                if order[p]["end_ns"] >= life.stored_ns:
                    life.owner, life.attribution = order[p]["request_uuid"], "tokens"
                    break


def _infer_evictors(ledger: Ledger, order: Sequence[Row], by_uuid: Mapping[str, Row]) -> None:
    starts = [r["start_ns"] for r in order]
    for life in ledger.lives:
        if life.removal != "evicted":
            continue
        if life.evictor is not None and life.evictor not in by_uuid:
            life.evictor, life.evictor_method = None, None  # a request of another run
        if life.evictor is None:
            t = life.removed_ns or 0
            # The request that started last among those in flight at t.
            for p in range(bisect_right(starts, t) - 1, -1, -1):
                if order[p]["end_ns"] >= t:
                    life.evictor, life.evictor_method = order[p]["request_uuid"], "in flight"
                    break
