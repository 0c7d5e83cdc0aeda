"""Cache provenance from the engine's KV events: who stored each block, who reused it, who lost it.

A ledger of block lives (stored -> removed) is built from the events in publish order
(finalize.ledger; build_ledger, Ledger and BlockLife are named here too). Blocks are matched to
prompts by their prefix: a block's key is its own tokens chained on its parent's key, the same
chaining the engines hash with, so a request's k-th full block of prompt tokens has the same key
as a stored block exactly when the whole prefix up to it is identical.

Attribution of a stored block to a request uses the event's session_id (kvscope sends the
request_uuid) and otherwise the in-flight request whose prompt holds that prefix. The evictor of
a removed block is inferred, never observed (engines publish no cause): the requests whose new
blocks were stored in the same scheduler step, else the request that started last among those
in flight. Both are marked as inferred in the output.

Uncached blocks are evicted (every earlier life of the key was removed by then), cold (a prompt
that started earlier holds the same prefix: it was still being computed) or layout (a prompt
that started earlier held the block's tokens at any offset, behind another prefix), else cold.
Keys and hashes come from records.blockkey (numpy); every request's blocks are looked up in
the ledger at once (finalize.keylives.KeyIndex, in chunks), and the layout check is answered for
all requests at once after that, keeping only the windows whose hash some check asks for. The
ledger is read, never changed: the results per life (owner, hits, needs) are the block table's.
"""

from array import array
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from kvscope.finalize import piecehash
from kvscope.finalize.blocktable import EVICTED, STILL_CACHED, LifeColumns, block_table
from kvscope.finalize.keylives import NEVER, KeyIndex
from kvscope.finalize.ledger import KEYED, BlockLife, Ledger, build_ledger
from kvscope.finalize.prompts import Prompts, Tokens, as_prompts
from kvscope.records import blockkey
from kvscope.records.requests import PROVENANCE_COLUMNS, STATUS_OK

_CHUNK = 1 << 16  # prompt blocks looked up at once (temporaries: a few of 8 bytes each)

Row = dict[str, Any]

__all__ = ["BlockLife", "Ledger", "Provenance", "admitted_ns", "build_ledger", "provenance"]


@dataclass(frozen=True)
class Provenance:
    rows: list[Row]  # the request rows, their provenance columns filled (in place) by apply()
    table: pa.Table  # the block table (records.blocks.BLOCKS_SCHEMA), one row per block life
    skipped: dict[str, int]  # requests left null, by reason
    queue_unknown: int = 0  # requests classified at their send time: no queue time reported
    # the classified rows and their columns, until apply() sets them (provenance(defer=True))
    pending: tuple[list[Row], dict[str, list[int]]] | None = None

    def apply(self) -> None:
        """Set the pending columns on their rows (nothing when none is pending)."""
        if self.pending is None:
            return
        done, columns = self.pending
        ints: dict[int, int] = {}  # one int object per distinct value, shared by the rows
        for r, values in zip(done, zip(*columns.values(), strict=True), strict=True):
            r.update((k, ints.setdefault(v, v)) for k, v in zip(columns, values, strict=True))
        done.clear()

    @property
    def blocks(self) -> list[Row]:
        """The block table as one dict per block life (records.blocks.BlockRecord.to_dict())."""
        return self.table.to_pylist()


@dataclass(frozen=True)
class _Prompts:
    """The prompts with tokens, in start order, as flat block arrays (blockkey.prompt_blocks)."""

    listed: Prompts  # their token ids
    position: list[int]  # index in the start order of each prompt
    keys: np.ndarray  # chained prefix keys, flat (uint64: 8 bytes a block, not a Python int)
    offsets: np.ndarray  # prompt j's blocks are [offsets[j], offsets[j + 1])
    size: int  # tokens a block

    def hashes(self, flat: np.ndarray) -> np.ndarray:
        """The blocks' own hashes, from their keys: a key chains on its parent's (blockkey:
        key = parent * B^size + hash; a prompt's first block's parent key is 0), so the hashes
        need not be held beside the keys (~60 MiB at 100k prompts)."""
        first = flat == self.offsets[self.holder(flat)]
        parent = np.where(first, 0, self.keys[np.maximum(flat - 1, 0)])
        return blockkey.unchain(self.keys[flat], parent, self.size)

    def seen_before(self, flat: np.ndarray) -> np.ndarray:
        """For flat blocks: whether a prompt that started earlier holds the same prefix key.

        Only the keys asked about are looked for, _CHUNK blocks at a time: memory is that of
        the question, not a sort of every block's key."""
        wanted = np.unique(self.keys[flat])
        first = np.full(len(wanted), len(self.keys), dtype=np.int64)  # first block with each
        for lo in range(0, len(self.keys) if len(wanted) else 0, _CHUNK):
            keys = self.keys[lo : lo + _CHUNK]
            at = np.searchsorted(wanted, keys).clip(max=len(wanted) - 1)
            hit = np.flatnonzero(wanted[at] == keys)
            np.minimum.at(first, at[hit], hit + lo)
        earliest = first[np.searchsorted(wanted, self.keys[flat])]
        return self.holder(earliest) < self.holder(flat)

    def holder(self, flat: np.ndarray) -> np.ndarray:
        """The prompt holding each flat block."""
        return np.searchsorted(self.offsets, flat, side="right") - 1


def _prompts(order: Sequence[Row], tokens: Prompts, size: int) -> _Prompts:
    position = [p for p, r in enumerate(order) if tokens.get(r["request_uuid"]) is not None]
    listed = tokens.named(order[p]["request_uuid"] for p in position)
    keys, _, offsets = piecehash.prompt_blocks(listed, size, hashes=False)
    return _Prompts(listed, position, keys, offsets, size)


def provenance(
    rows: Sequence[Row],
    tokens: Prompts | Mapping[str, Tokens],
    ledger: Ledger,
    replica: str | None = None,
    defer: bool = False,
) -> Provenance:
    """Per-request provenance columns and the block table (owners, evictors, harm): `rows` the
    calls one cache served, `ledger` that cache's blocks (`replica`: its name in a deployment).

    The columns are set on the rows in place (finalize's rows are its own: new dicts for a
    100k-call run were ~200 MiB more at its peak); Provenance.rows lists the same rows. With
    `defer`, they are set by Provenance.apply() (finalize: once the prompt ids are freed, as the
    rows' dicts grow by ~60 MiB at 100k calls)."""
    size = ledger.block_size
    tokens = as_prompts(tokens)
    by_uuid = {r["request_uuid"]: r for r in rows}
    skipped: dict[str, int] = defaultdict(int)
    if size is None:  # no life was stored
        lives = _outcomes(ledger, [], [], *_evictors(ledger, [], {}))
        empty = block_table(lives, by_uuid, replica)
        return Provenance(list(rows), empty, {"no stored blocks": len(rows)})
    order = sorted(rows, key=lambda r: r["start_ns"])
    prompts = _prompts(order, tokens, size)
    owner, attribution = _owners(ledger, order, prompts)
    done: list[Row] = []  # the requests classified, in start order
    prompt_of = array("q")  # the index of each one's prompt in `prompts` (no int objects)
    j = 0
    for p, r in enumerate(order):
        reason = _unusable(r, tokens, tokens.get(r["request_uuid"]))
        if reason is None:
            while prompts.position[j] != p:
                j += 1
            done.append(r)
            prompt_of.append(j)
        else:
            skipped[reason] += 1
    lives = _outcomes(ledger, owner, attribution, *_evictors(ledger, order, by_uuid))
    found = _match(ledger, lives, done, np.asarray(prompt_of), prompts, by_uuid)
    layout = _layout_blocks(prompts, size, found.asks, found.asker, len(done))
    # the pass's state is freed (and its heap given back: neither Arrow's buffers nor the row
    # dicts come from that heap) before the table, then the lives before the rows
    del prompts, owner, attribution
    table = block_table(lives, by_uuid, replica)
    del lives
    unknown = sum(r.get("queue_ms") is None for r in done)
    out = Provenance(
        list(rows), table, dict(skipped), unknown, (done, _columns(done, found, layout, size))
    )
    if not defer:
        out.apply()
    return out


def _outcomes(
    ledger: Ledger,
    owner: list[str | None],
    attribution: list[str | None],
    evictor: list[str | None],
    method: list[str | None],
) -> LifeColumns:
    """The block table's columns: the ledger's, with hits and needs still 0 (_match fills)."""
    n = len(ledger)
    return LifeColumns(
        ledger.block_hash, ledger.tokens, ledger.stored_ns, ledger.removed_ns, ledger.removal,
        owner or [None] * n, attribution or [None] * n, np.zeros(n, dtype=np.int64),
        evictor, method, [None] * n, np.zeros(n, dtype=np.int64),
    )  # fmt: skip


@dataclass(frozen=True)
class _Found:
    """Per classified request (in start order), its blocks found in the ledger, by kind."""

    blocks: dict[str, np.ndarray]  # self, cross_agent, cross_workflow, unattributed, evicted
    hit_blocks: np.ndarray  # its blocks within its reported cached tokens
    asks: np.ndarray  # flat blocks left for the layout check
    asker: np.ndarray  # the request asking for each


def _match(
    ledger: Ledger,
    lives: LifeColumns,
    done: Sequence[Row],
    prompt_of: np.ndarray,
    prompts: _Prompts,
    by_uuid: Mapping[str, Row],
) -> _Found:
    """Look every block of the `done` requests up in the ledger at the request's time: a block
    within the cached tokens is credited to the resident life's owner (its hits + 1), a block
    past them is evicted when every earlier life of its key was removed (that life's needed + 1,
    its needed_by the first such request), else left for the layout check unless an earlier
    prompt holds the same prefix (cold). Vectorised, _CHUNK blocks at a time."""
    size = ledger.block_size or 1
    n = len(done)
    offsets = prompts.offsets
    which = prompt_of.astype(np.int64)
    lo, n_blocks = offsets[which], offsets[which + 1] - offsets[which]
    t = np.array([admitted_ns(r) for r in done], dtype=np.int64)
    cached = np.array([r["cached_tokens"] // size for r in done], dtype=np.int64)
    hit_blocks = np.minimum(cached, n_blocks)
    # the requests' and the owners' request_uuid, workflow and agent as ints, equal where equal
    # (an owner is a request of the run: owners come from its rows, by_uuid; -1: no owner)
    codes: dict[Any, int] = {}
    fields = ("request_uuid", "workflow_run_id", "agent_id")
    uuid_of, wf_of, agent_of = (
        np.array([codes.setdefault(r[k], len(codes)) for r in done], dtype=np.int64) for k in fields
    )
    rows_of = [by_uuid[u] if u is not None else None for u in lives.owner]
    owned_by, owner_wf, owner_agent = (
        np.array([codes.setdefault(o[k], len(codes)) if o else -1 for o in rows_of], np.int64)
        for k in fields
    )
    del rows_of
    keyed = np.flatnonzero(ledger.key_state == KEYED)
    removed = np.where(ledger.removal == STILL_CACHED, NEVER, ledger.removed_ns)
    index = KeyIndex(ledger.key[keyed], ledger.stored_ns[keyed], removed[keyed])
    del removed
    kinds = ("self", "cross_agent", "cross_workflow", "unattributed", "evicted")
    blocks = {k: np.zeros(n, dtype=np.int64) for k in kinds}
    first_needer = np.full(len(ledger), n, dtype=np.int64)
    asks, asker = [], []
    ends = np.cumsum(n_blocks)
    a = 0
    while a < n:
        b = max(int(np.searchsorted(ends, ends[a] - n_blocks[a] + _CHUNK, side="right")), a + 1)
        counts = n_blocks[a:b]
        req = np.repeat(np.arange(a, b), counts)  # the request of each block looked up
        within = blockkey.within(counts)
        flat = lo[req] + within  # in prompts' flat arrays
        hit = within < hit_blocks[req]
        m = index.query(prompts.keys[flat], t[req], hit)
        m = np.where(m >= 0, keyed[np.maximum(m, 0)], -1)  # -> ledger lives
        # cached blocks: credited to the resident life's owner unless it is none or the request
        mh, rh = m[hit], req[hit]
        owner = np.where(mh >= 0, owned_by[np.maximum(mh, 0)], -1)
        credited = (owner >= 0) & (owner != uuid_of[rh])
        lives.hits[:] += np.bincount(mh[credited], minlength=len(ledger))
        cross_wf = credited & (owner_wf[mh] != wf_of[rh])
        same = credited & ~cross_wf & (owner_agent[mh] == agent_of[rh])
        for kind, sel in (("self", same), ("cross_agent", credited & ~cross_wf & ~same),
                          ("cross_workflow", cross_wf), ("unattributed", ~credited)):  # fmt: skip
            blocks[kind] += np.bincount(rh[sel], minlength=n)
        # uncached blocks: evicted (a removed life), else cold or to check for layout
        mu, ru, fu = m[~hit], req[~hit], flat[~hit]
        gone = mu >= 0
        lives.needed[:] += np.bincount(mu[gone], minlength=len(ledger))
        np.minimum.at(first_needer, mu[gone], ru[gone])
        blocks["evicted"] += np.bincount(ru[gone], minlength=n)
        asks.append(fu[~gone])  # unless an earlier prompt holds the prefix: cold (below)
        asker.append(ru[~gone])
        a = b
    for life in np.flatnonzero(first_needer < n).tolist():
        lives.needed_by[life] = done[first_needer[life]]["request_uuid"]
    flat = np.concatenate([np.zeros(0, dtype=np.int64), *asks])
    by = np.concatenate([np.zeros(0, dtype=np.int64), *asker])
    new = ~prompts.seen_before(flat)
    return _Found(blocks, hit_blocks, flat[new], by[new])


def _layout_blocks(
    prompts: _Prompts, size: int, asks: np.ndarray, asker: np.ndarray, n: int
) -> np.ndarray:
    """Per request, its blocks whose tokens an earlier prompt held at another offset."""
    out = np.zeros(n, dtype=np.int64)
    if not len(asks):
        return out
    uniq = np.unique(prompts.hashes(asks))
    first = piecehash.first_windows_of_sorted(prompts.listed, size, uniq)
    for lo in range(0, len(asks), _CHUNK):  # temporaries of a chunk, not of every ask
        part = asks[lo : lo + _CHUNK]
        found = first[np.searchsorted(uniq, prompts.hashes(part))] < prompts.holder(part)
        out += np.bincount(asker[lo : lo + _CHUNK][found], minlength=n)
    return out


def _unusable(r: Row, tokens: Prompts, i: int | None) -> str | None:
    """Why provenance cannot classify the call (`i`: its prompt in `tokens`); None: it can."""
    if r["status"] != STATUS_OK:
        return "failed request"
    if i is None:
        return "no prompt tokens"
    if r.get("cached_tokens") is None or r.get("prompt_tokens") is None:
        return "cached tokens not reported"
    if tokens.lengths[i] != r["prompt_tokens"]:
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


def _columns(
    done: Sequence[Row], found: _Found, layout: np.ndarray, size: int
) -> dict[str, list[int]]:
    """The provenance columns of the `done` requests (in their order), in tokens: the cached
    ones by kind (the unattributed ones include a partial cached block), the uncached ones
    evicted, then layout, then cold (the rest), each bounded by what is left."""
    prompt = np.array([r["prompt_tokens"] for r in done], dtype=np.int64)
    cached = np.array([r["cached_tokens"] for r in done], dtype=np.int64)
    b = found.blocks
    uncached = np.maximum(prompt - cached, 0)
    evicted = np.minimum(b["evicted"] * size, uncached)
    layout = np.minimum(layout * size, np.maximum(uncached - evicted, 0))
    values = (
        b["self"] * size, b["cross_agent"] * size, b["cross_workflow"] * size,
        b["unattributed"] * size + cached - found.hit_blocks * size,
        evicted, layout, uncached - evicted - layout,
    )  # fmt: skip
    return {k: v.tolist() for k, v in zip(PROVENANCE_COLUMNS, values, strict=True)}


def _owners(
    ledger: Ledger, order: Sequence[Row], prompts: _Prompts
) -> tuple[list[str | None], list[str | None]]:
    """Each life's owner (request_uuid) and how it was attributed: its session_id when that is a
    request of `order`, else the earliest-started request in flight when it was stored whose
    prompt holds its prefix key (a keyed life only)."""
    uuids = {r["request_uuid"] for r in order}
    owner = [s if s in uuids else None for s in ledger.session_id]
    attribution: list[str | None] = ["session_id" if o else None for o in owner]
    unowned = np.array([o is None for o in owner], dtype=bool)
    ask = np.flatnonzero(unowned & (ledger.key_state == KEYED))
    if not len(ask):
        return owner, attribution
    holders = _holders(prompts, np.unique(ledger.key[ask]))
    starts = [r["start_ns"] for r in order]
    keys, stored = ledger.key[ask].tolist(), ledger.stored_ns[ask].tolist()
    for life, key, t in zip(ask.tolist(), keys, stored, strict=True):
        bound = bisect_right(starts, t)
        for p in holders.get(key, ()):
            if p >= bound:
                break
            if order[p]["end_ns"] >= t:
                owner[life], attribution[life] = order[p]["request_uuid"], "tokens"
                break
    return owner, attribution


def _holders(prompts: _Prompts, wanted: np.ndarray) -> dict[int, list[int]]:
    """Each wanted prefix key -> the start positions of the prompts holding it, ascending."""
    where = np.flatnonzero(np.isin(prompts.keys, wanted))
    prompt = prompts.holder(where)
    position = np.asarray(prompts.position)[prompt].tolist() if len(where) else []
    holders: dict[int, list[int]] = defaultdict(list)
    for k, p in zip(prompts.keys[where].tolist(), position, strict=True):
        if not holders[k] or holders[k][-1] != p:
            holders[k].append(p)
    return holders


def _evictors(
    ledger: Ledger, order: Sequence[Row], by_uuid: Mapping[str, Row]
) -> tuple[list[str | None], list[str | None]]:
    """Each evicted life's evictor and how it was inferred: the ledger's same-step store when
    it is a request of this run, else the request that started last among those in flight."""
    evictor, method = list(ledger.evictor), [None] * len(ledger)
    starts = [r["start_ns"] for r in order]
    evicted = np.flatnonzero(ledger.removal == EVICTED)
    for life, t in zip(evicted.tolist(), ledger.removed_ns[evicted].tolist(), strict=True):
        who = evictor[life]
        if who is not None and who in by_uuid:
            method[life] = "same-step store"
            continue
        evictor[life] = None  # none, or a request of another run
        for p in range(bisect_right(starts, t) - 1, -1, -1):
            if order[p]["end_ns"] >= t:
                evictor[life], method[life] = order[p]["request_uuid"], "in flight"
                break
    return evictor, method
