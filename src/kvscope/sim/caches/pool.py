"""vLLM's block pool, fast, with a pluggable eviction order.

vLLM v1's block pool (vllm/v1/core/block_pool.py, kv_cache_manager.py), as replayed here:
- N physical blocks; a block holds one key (a full block of prompt tokens and its prefix) or none.
- A request looks up its keys in order and stops at the first miss; at most (prompt - 1) tokens
  may hit (the last prompt token is always computed), so at most (prompt - 1) // block_size.
- Hit blocks are touched: taken out of the free queue if no running request holds them.
- The rest of its blocks, ceil((prompt + output - 1) / block_size) in all (the last sampled
  token is never fed back, so it takes no KV slot), are popped from the head of the free queue;
  a popped block that held a hash loses it (the eviction; vLLM emits BlockRemoved).
- Its full prompt blocks then hold their keys (a key may be held by two blocks; a lookup takes
  the first stored, as vLLM's `get_cached_block`). Blocks filled up with output tokens
  ((prompt + output - 1) // block_size full blocks in all) are hashed too, as vLLM hashes every
  full block it computed, but their content is unknown to a trace: an opaque hash that no lookup
  matches. The last, partial block has no hash.
- When it ends, each block no running request holds any more goes back to the free queue, in
  reverse order (its tail first): a hashed block is appended to the tail, a block without a hash
  is PREPENDED to the head (it is reused before any cached block is evicted). This split is
  vLLM >= 0.24's `BlockPool.free_blocks` (prepend_n of the blocks without hash, append_n of the
  rest); before 0.24 everything was appended.
- Requests start at `start_s` and end at `end_s`; at equal times ends come first, except that a
  request with no duration (end = start) ends right after its own start.
- The null block (block 0, taken at start-up) is not counted: `capacity_blocks` is the usable
  number, i.e. `--num-gpu-blocks-override` minus 1.

Evidence for the free-queue split (tests/fixtures/replay/pathology, vLLM 0.32 CPU, 27 usable
blocks of 128 tokens, 12 calls of 937 prompt + 16 output tokens = 8 blocks, 7 of them hashed):
the engine's KV events remove 0, 0, 0, 2, 2, ... blocks per call and it measured 640 cached tokens
(5 blocks) on every call of cycles 2-3. Appending everything, the 4th call pops 3 fresh blocks,
then the 1st call's partial block and 4 of its hashed blocks (4 removed, 384 cached later),
which matched the engine only at 29 blocks. With the partial blocks of calls 1-3 at the head,
the 4th call pops 3 fresh + 3 partial + 2 hashed: 2 removed per call, 640 cached, at 27.

Contract: with `LRUOrder` the result equals the plain, slow replay of these rules
(tests/unit/sim/pool_reference.py, the oracle) exactly (cached blocks, harm rows, evictions,
preemptions). Physical block ids may differ (blank blocks are interchangeable), nothing
observable does. With another order only the choice among evictable hashed blocks changes: blank
blocks (no hash) are still reused first, held blocks are never evicted, a key is looked up in
the first block that stored it.

Cost: LRU, Belady (and no cache) without a host tier run in pool_compiled.py's kernel (the same
result; ~10 ns a block). Other orders, and `compiled=False`: per request a few C-level calls over
its block list (lookup by `map`, reference counts in numpy, the order's bulk hooks) plus a Python
loop over its *missed* blocks only.
"""

from __future__ import annotations

import time
from collections import deque
from itertools import repeat

import numpy as np

from kvscope.sim.caches.compiled import worth_compiling
from kvscope.sim.caches.events import event_order, start_rank
from kvscope.sim.caches.host_tier import HostTier
from kvscope.sim.caches.result import SimResult
from kvscope.sim.caches.states import BLANK, KEYED, OPAQUE
from kvscope.sim.orders.base import EvictionOrder
from kvscope.sim.trace import Trace


def harm_arrays(harm: dict[tuple[int, int, int], int]) -> dict[str, np.ndarray]:
    rows = sorted(harm.items())
    return {
        "harm_request": np.array([r[0][0] for r in rows], dtype=np.int64),
        "harm_evictor": np.array([r[0][1] for r in rows], dtype=np.int64),
        "harm_owner": np.array([r[0][2] for r in rows], dtype=np.int64),
        "harm_blocks": np.array([r[1] for r in rows], dtype=np.int64),
    }


def simulate_pool(
    trace: Trace,
    capacity_blocks: int,
    order: EvictionOrder,
    *,
    caching: bool = True,
    host: HostTier | None = None,
    head_first: bool = False,
    compiled: bool | None = None,
) -> SimResult:
    """Replay `trace` through a vLLM block pool of `capacity_blocks` usable blocks.

    `caching=False` is the no-cache counterfactual: nothing is looked up or kept. `host`: a host
    tier below the device (tiers.py), None for none. `head_first`: a request's blocks go back to
    the free queue first block first (its first block is evicted first, as kvlint's and
    prefixlens' LRU do), not vLLM's tail first. `compiled`: an order pool_compiled.py runs (LRU,
    Belady) without a host tier replays in its compiled kernel (the same result); False, or any
    other order: this Python replay; None: compiled where the trace is large enough for it to pay
    (compiled.worth_compiling).
    """
    rank = start_rank(trace)
    order.bind(trace, capacity_blocks, rank)
    if compiled is None:
        compiled = worth_compiling(len(trace.keys))
    if compiled and host is None:
        from kvscope.sim.caches.pool_compiled import simulate_compiled

        done = simulate_compiled(
            trace, capacity_blocks, order, rank, caching=caching, head_first=head_first
        )
        if done is not None:
            return done
    started = time.perf_counter()
    n, bs = len(trace), trace.block_size
    if host is not None:
        host.bind(trace)
    ref = np.zeros(capacity_blocks, dtype=np.int64)
    state = np.zeros(capacity_blocks, dtype=np.int8)  # BLANK, KEYED or OPAQUE
    key_of = np.zeros(capacity_blocks, dtype=np.uint64)  # when KEYED
    owner_of = np.full(capacity_blocks, -1, dtype=np.int64)  # request that stored the key
    blank = list(range(capacity_blocks - 1, -1, -1))  # free blocks without a hash (a stack)
    index: dict[int, int] = {}  # key -> first block that stored it
    dups: dict[int, list[int]] = {}  # key -> later blocks holding it, in the order stored
    evicted_by: dict[int, int] = {}  # key -> evictor << 32 | (owner + 1), until stored again
    held: dict[int, np.ndarray] = {}  # running request -> its blocks, tail first
    cached = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=bool)
    harm: dict[tuple[int, int, int], int] = {}
    evictions = 0
    prompt = trace.prompt_tokens.tolist()
    output = trace.output_tokens.tolist()
    offsets = trace.offsets.tolist()
    keys_all = trace.keys
    index_get, evicted_get = index.get, evicted_by.get

    reqs, kinds = event_order(trace)
    for i, kind in zip(reqs.tolist(), kinds.tolist(), strict=True):
        if kind == 0:  # end: blocks back to the free queue, tail first
            arr = held.pop(i, None)
            if head_first and arr is not None:
                arr = arr[::-1]
            if arr is not None and len(arr):
                ref[arr] -= 1
                freed = arr[ref[arr] == 0]
                hashed_mask = state[freed] != BLANK
                hashed = freed[hashed_mask].tolist()
                if len(hashed) != len(freed):
                    blank.extend(freed[~hashed_mask].tolist())
                if hashed:
                    order.released(i, hashed)
            order.finished(i)
            continue

        order.start(i)
        kslice = keys_all[offsets[i] : offsets[i + 1]]
        keys = kslice.tolist()
        p = prompt[i]
        limit = max(p - 1, 0) // bs if caching else 0
        hits = list(map(index_get, keys[:limit]))
        h = hits.index(None) if None in hits else len(hits)
        mine = hits[:h]
        if h:
            order.touched(i, mine)
        cached[i] = h
        loaded = host.match(i, keys, h, limit) if host is not None else 0
        missed = keys[h + loaded :]
        if evicted_by and not evicted_by.keys().isdisjoint(missed):
            for k in missed:
                e = evicted_get(k)
                if e is not None and k not in index:
                    row = (i, e >> 32, (e & 0xFFFFFFFF) - 1)
                    harm[row] = harm.get(row, 0) + 1
        computed = p + output[i] - 1
        total, full = -(-computed // bs), computed // bs
        need = total - h
        take = min(need, len(blank))
        new = blank[len(blank) - take :][::-1] if take else []
        del blank[len(blank) - take :]
        rest = need - take
        if rest:
            if rest > len(order):
                preempted[i] = True
                rest = len(order)
            if rest:
                victims = order.pop_many(rest)
                evictions += rest
                dropped = _evict(i, victims, state, key_of, owner_of, index, dups, evicted_by)
                if host is not None and dropped:
                    host.offload(dropped)
                new += victims
        both = np.array((mine + new)[::-1], dtype=np.int64)
        ref[both] += 1
        held[i] = both
        if not new:
            continue
        narr = both[len(new) - 1 :: -1]
        if caching:
            nk = min(len(keys), h + len(new)) - h  # new blocks that get a prompt key
            ks = keys[h : h + nk]
            if index.keys().isdisjoint(ks) and len(set(ks)) == nk:
                index.update(zip(ks, new, strict=False))
                if evicted_by:
                    deque(map(evicted_by.pop, ks, repeat(None)), maxlen=0)
            else:
                _store_slow(ks, new, index, dups, evicted_by)
            kb = narr[:nk]
            key_of[kb] = kslice[h : h + nk]
            state[kb] = KEYED
            owner_of[kb] = i
            nop = max(0, min(full, h + len(new)) - h - nk)
            state[narr[nk : nk + nop]] = OPAQUE
            state[narr[nk + nop :]] = BLANK
            order.stored(i, new, h)

    return SimResult(
        policy=order.name if caching else "none",
        capacity_blocks=capacity_blocks,
        block_size=bs,
        cached_blocks=cached,
        host_blocks=np.zeros(n, dtype=np.int64) if host is None else host.hits,
        prefetched_blocks=None if host is None else host.prefetched,
        preempted=preempted,
        evictions=evictions,
        seconds=time.perf_counter() - started,
        **harm_arrays(harm),
    )


def _evict(
    i: int,
    victims: list[int],
    state: np.ndarray,
    key_of: np.ndarray,
    owner_of: np.ndarray,
    index: dict[int, int],
    dups: dict[int, list[int]],
    evicted_by: dict[int, int],
) -> list[int]:
    """Drop the keys of the `victims` request i took; record who evicted a key's last copy.
    Returns the keys no device block holds any more."""
    varr = np.array(victims, dtype=np.int64)
    kv = varr[state[varr] == KEYED]
    if not len(kv):
        return []
    vkeys = key_of[kv].tolist()
    packed = ((i << 32) + owner_of[kv] + 1).tolist()
    if not dups or dups.keys().isdisjoint(vkeys):  # one block per key: C-level bulk updates
        deque(map(index.pop, vkeys), maxlen=0)
        evicted_by.update(zip(vkeys, packed, strict=True))
        return vkeys
    dropped: list[int] = []
    for k, b, e in zip(vkeys, kv.tolist(), packed, strict=True):
        d = dups.get(k)
        if index[k] == b:
            if d:
                index[k] = d.pop(0)
                if not d:
                    del dups[k]
            else:
                del index[k]
                evicted_by[k] = e
                dropped.append(k)
        else:
            assert d is not None
            d.remove(b)
            if not d:
                del dups[k]
    return dropped


def _store_slow(
    ks: list[int],
    blocks: list[int],
    index: dict[int, int],
    dups: dict[int, list[int]],
    evicted_by: dict[int, int],
) -> None:
    """Index `ks[j]` in `blocks[j]`; a key already held elsewhere becomes a duplicate."""
    for k, b in zip(ks, blocks, strict=False):
        if k in index:
            dups.setdefault(k, []).append(b)
        else:
            index[k] = b
            evicted_by.pop(k, None)
