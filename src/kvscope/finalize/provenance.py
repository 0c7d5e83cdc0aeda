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
"""

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscope.records.blocks import BlockRecord
from kvscope.records.kv_events import KvBatch, KvEvent
from kvscope.records.requests import STATUS_OK, transition_label

_ROOT = 0
_MOD = (1 << 61) - 1  # rolling hash modulus (a Mersenne prime)
_BASE = 1_000_003

Row = dict[str, Any]


@dataclass
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
    hits: list[str] = field(default_factory=list)  # requests served by this life
    needed_by: list[str] = field(default_factory=list)  # requests that recomputed it after


@dataclass(frozen=True)
class Ledger:
    lives: list[BlockLife]
    block_size: int | None
    orphan_blocks: int  # stored with a parent never seen: no prefix key, never matched


def chain_key(parent: int, chunk: Sequence[int]) -> int:
    return hash((parent, tuple(chunk)))


def prompt_keys(ids: Sequence[int], block_size: int) -> list[int]:
    """The prefix keys of a prompt's full blocks."""
    keys, parent = [], _ROOT
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = chain_key(parent, ids[start : start + block_size])
        keys.append(parent)
    return keys


def build_ledger(events: Iterable[tuple[KvBatch, KvEvent]]) -> Ledger:
    """Block lives from (batch, event) pairs in publish order (read_batches + events_of)."""
    lives: list[BlockLife] = []
    alive: dict[int, BlockLife] = {}
    block_size: int | None = None
    orphans = 0
    step_stores: dict[int, list[str]] = defaultdict(list)  # seq -> session_ids stored then
    removed_in: list[tuple[BlockLife, int]] = []
    for batch, e in events:
        ts, seq = batch.ts_ns, batch.seq
        if e.kind == "stored":
            size = e.block_size or block_size
            block_size = block_size or size
            if size is None:
                continue
            parent = e.parent_block_hash
            key: int | None = _ROOT if parent is None else _key_of(alive, parent)
            for i, h in enumerate(e.block_hashes):
                chunk = e.token_ids[i * size : (i + 1) * size]
                key = None if key is None else chain_key(key, chunk)
                orphans += key is None
                life = BlockLife(h, key, len(chunk), ts, seq, e.session_id)
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
    for life, seq in removed_in:
        stores = [s for s in step_stores.get(seq, ()) if s]
        if stores:
            life.evictor, life.evictor_method = stores[0], "same-step store"
    return Ledger(lives, block_size, orphans)


def _key_of(alive: Mapping[int, BlockLife], parent: int) -> int | None:
    life = alive.get(parent)
    return None if life is None else life.key


@dataclass(frozen=True)
class Provenance:
    rows: list[Row]  # the request rows with the provenance columns filled
    blocks: list[Row]  # one row per block life
    skipped: dict[str, int]  # requests left null, by reason


def provenance(
    rows: Sequence[Row], tokens: Mapping[str, Sequence[int]], ledger: Ledger
) -> Provenance:
    """Per-request provenance columns and the block table (owners, evictors, harm)."""
    size = ledger.block_size
    by_uuid = {r["request_uuid"]: r for r in rows}
    skipped: dict[str, int] = defaultdict(int)
    if size is None:
        return Provenance(list(rows), [], {"no stored blocks": len(rows)})
    order = sorted(rows, key=lambda r: r["start_ns"])
    keys = {u: prompt_keys(ids, size) for u, ids in tokens.items()}
    _attribute_owners(ledger, order, keys, by_uuid)
    _infer_evictors(ledger, order, by_uuid)
    by_key: dict[int, list[BlockLife]] = defaultdict(list)
    for life in ledger.lives:
        if life.key is not None:
            by_key[life.key].append(life)
    seen = _Windows(size)
    seen_keys: set[int] = set()  # prefixes of prompts that started earlier
    out: dict[str, Row] = {}
    for r in order:
        ids = tokens.get(r["request_uuid"])
        reason = _unusable(r, ids)
        if reason is None:
            assert ids is not None
            mine = keys[r["request_uuid"]]
            out[r["request_uuid"]] = r | _classify(
                r, ids, mine, by_key, by_uuid, (seen, seen_keys), size
            )
        else:
            skipped[reason] += 1
        if ids is not None:
            seen.add(ids)
            seen_keys.update(keys[r["request_uuid"]])
    result = [out.get(r["request_uuid"], r) for r in rows]
    return Provenance(result, [_block_row(b, by_uuid) for b in ledger.lives], dict(skipped))


def _unusable(r: Row, ids: Sequence[int] | None) -> str | None:
    if r["status"] != STATUS_OK:
        return "failed request"
    if ids is None:
        return "no prompt tokens"
    if r.get("cached_tokens") is None or r.get("prompt_tokens") is None:
        return "cached tokens not reported"
    if len(ids) != r["prompt_tokens"]:
        return "kvscope's tokenization differs from the engine's count"
    return None


def _admitted(r: Row) -> int:
    """When the engine scheduled the request: after its server-side queue time, if known."""
    return r["start_ns"] + int((r.get("queue_ms") or 0.0) * 1e6)


def _classify(
    r: Row,
    ids: Sequence[int],
    keys: list[int],
    by_key: Mapping[int, list[BlockLife]],
    by_uuid: Mapping[str, Row],
    seen: tuple["_Windows", set[int]],
    size: int,
) -> Row:
    cached, prompt = r["cached_tokens"], r["prompt_tokens"]
    t = _admitted(r)
    counts = dict.fromkeys(("self", "cross_agent", "cross_workflow", "unattributed"), 0)
    hit_blocks = min(cached // size, len(keys))
    for i in range(hit_blocks):
        life = _resident(by_key.get(keys[i], ()), t)
        if life is None or life.owner is None or life.owner == r["request_uuid"]:
            counts["unattributed"] += size
            continue
        life.hits.append(r["request_uuid"])
        counts[_relation(r, by_uuid.get(life.owner))] += size
    counts["unattributed"] += cached - hit_blocks * size
    evicted = layout = 0
    for i in range(hit_blocks, len(keys)):
        before = [b for b in by_key.get(keys[i], ()) if b.stored_ns <= t]
        if before and all(b.removed_ns is not None and b.removed_ns <= t for b in before):
            before[-1].needed_by.append(r["request_uuid"])
            evicted += size
        elif keys[i] in seen[1]:
            continue  # the same prefix was being computed by a request in flight: cold
        elif seen[0].contains(ids[i * size : (i + 1) * size]):
            layout += size
    uncached = max(prompt - cached, 0)
    evicted, layout = min(evicted, uncached), min(layout, max(uncached - evicted, 0))
    return {
        "cached_self_tokens": counts["self"],
        "cached_cross_agent_tokens": counts["cross_agent"],
        "cached_cross_workflow_tokens": counts["cross_workflow"],
        "cached_unattributed_tokens": counts["unattributed"],
        "uncached_evicted_tokens": evicted,
        "uncached_layout_tokens": layout,
        "uncached_cold_tokens": uncached - evicted - layout,
    }


def _resident(lives: Sequence[BlockLife], t: int) -> BlockLife | None:
    """The life of a block that was in the cache at time t (the latest stored before t)."""
    for life in reversed(lives):
        if life.stored_ns <= t and (life.removed_ns is None or life.removed_ns > t):
            return life
    return None


def _relation(r: Row, owner: Row | None) -> str:
    if owner is None:
        return "unattributed"
    if owner["workflow_run_id"] != r["workflow_run_id"]:
        return "cross_workflow"
    return "self" if owner["agent_id"] == r["agent_id"] else "cross_agent"


def _attribute_owners(
    ledger: Ledger, order: Sequence[Row], keys: Mapping[str, list[int]], by_uuid: Mapping[str, Row]
) -> None:
    starts = [r["start_ns"] for r in order]
    for life in ledger.lives:
        if life.session_id in by_uuid:
            life.owner, life.attribution = life.session_id, "session_id"
        elif life.key is not None:
            # The earliest-started in-flight request whose prompt holds this prefix.
            for r in order[: bisect_right(starts, life.stored_ns)]:
                if r["end_ns"] >= life.stored_ns and life.key in keys.get(r["request_uuid"], ()):
                    life.owner, life.attribution = r["request_uuid"], "tokens"
                    break


def _infer_evictors(ledger: Ledger, order: Sequence[Row], by_uuid: Mapping[str, Row]) -> None:
    starts = [r["start_ns"] for r in order]
    for life in ledger.lives:
        if life.removal != "evicted":
            continue
        if life.evictor is not None and life.evictor not in by_uuid:
            life.evictor, life.evictor_method = None, None  # a request of another run
        if life.evictor is None:
            flying = [
                r for r in order[: bisect_right(starts, life.removed_ns or 0)]
                if r["end_ns"] >= (life.removed_ns or 0)
            ]  # fmt: skip
            if flying:
                life.evictor, life.evictor_method = flying[-1]["request_uuid"], "in flight"


def _block_row(b: BlockLife, by_uuid: Mapping[str, Row]) -> Row:
    owner, evictor = by_uuid.get(b.owner or ""), by_uuid.get(b.evictor or "")
    needer = by_uuid.get(b.needed_by[0]) if b.needed_by else None
    harmful = b.removal == "evicted" and bool(b.needed_by)
    return BlockRecord(
        block_hash=b.block_hash,
        tokens=b.tokens,
        stored_ns=b.stored_ns,
        removed_ns=b.removed_ns,
        removal=b.removal,
        residency_ms=None if b.removed_ns is None else (b.removed_ns - b.stored_ns) / 1e6,
        owner_request_uuid=b.owner,
        owner_agent_id=owner["agent_id"] if owner else None,
        owner_workflow_run_id=owner["workflow_run_id"] if owner else None,
        owner_turn_id=owner["turn_id"] if owner else None,
        attribution=b.attribution,
        hits=len(b.hits),
        evictor_request_uuid=b.evictor,
        evictor_agent_id=evictor["agent_id"] if evictor else None,
        evictor_workflow_run_id=evictor["workflow_run_id"] if evictor else None,
        evictor_inferred=b.evictor_method,
        harmful=harmful,
        recomputed_tokens=b.tokens * len(b.needed_by) if harmful else 0,
        needed_by_request_uuid=needer["request_uuid"] if needer else None,
        needed_by_agent_id=needer["agent_id"] if needer else None,
        needed_by_transition=(
            transition_label(needer.get("previous_agent_id"), needer["agent_id"])
            if needer
            else None
        ),
    ).to_dict()


class _Windows:
    """Every block-long token window of the prompts seen so far (rolling hash, O(L) a prompt)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.top = pow(_BASE, size - 1, _MOD)
        self.hashes: set[int] = set()

    def add(self, ids: Sequence[int]) -> None:
        n = self.size
        if len(ids) < n:
            return
        h = 0
        for t in ids[:n]:
            h = (h * _BASE + t + 1) % _MOD
        self.hashes.add(h)
        for i in range(n, len(ids)):
            h = ((h - (ids[i - n] + 1) * self.top) * _BASE + ids[i] + 1) % _MOD
            self.hashes.add(h)

    def contains(self, chunk: Sequence[int]) -> bool:
        if len(chunk) != self.size:
            return False
        h = 0
        for t in chunk:
            h = (h * _BASE + t + 1) % _MOD
        return h in self.hashes
