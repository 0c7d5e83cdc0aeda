"""A plain, slow, obviously-faithful replay of vLLM's prefix cache: the oracle for the fast ones.

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
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict

import numpy as np

from kvscope.sim.caches.result import SimResult
from kvscope.sim.trace import Trace


def simulate_lru(trace: Trace, capacity_blocks: int) -> SimResult:
    started = time.perf_counter()
    n, bs = len(trace), trace.block_size
    free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(capacity_blocks))
    key_of: dict[int, int | None] = {}  # hashed physical block -> key (None: opaque output hash)
    blocks_of_key: dict[int, dict[int, None]] = defaultdict(dict)  # in the order stored
    owner_of: dict[int, int] = {}  # physical block -> request that stored its key
    ref = [0] * capacity_blocks
    held: dict[int, list[int]] = {}
    evicted_by: dict[int, tuple[int, int]] = {}  # key -> (evictor, owner), until stored again
    cached = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=bool)
    harm: dict[tuple[int, int, int], int] = defaultdict(int)
    evictions = 0

    events = sorted(
        [(float(trace.start_s[i]), 1, i, 0) for i in range(n)]
        + [
            (float(trace.end_s[i]), 0 if trace.end_s[i] > trace.start_s[i] else 1, i, 1)
            for i in range(n)
        ]
    )
    for _, _, i, is_end in events:
        kind = 0 if is_end else 1
        if kind == 0:  # end: release in reverse order
            unhashed: list[int] = []
            for b in reversed(held.pop(i, [])):
                ref[b] -= 1
                if ref[b] == 0:
                    if b in key_of:
                        free[b] = None
                    else:
                        unhashed.append(b)
            for b in reversed(unhashed):  # prepend_n: the list lands at the head in its order
                free[b] = None
                free.move_to_end(b, last=False)
            continue
        keys = [int(k) for k in trace.blocks_of(i)]
        limit = max(int(trace.prompt_tokens[i]) - 1, 0) // bs
        mine: list[int] = []
        for k in keys[:limit]:
            hit = blocks_of_key.get(k)
            if not hit:
                break
            b = next(iter(hit))
            if ref[b] == 0:
                free.pop(b)
            ref[b] += 1
            mine.append(b)
        cached[i] = len(mine)
        for k in keys[len(mine) :]:
            if k in evicted_by and k not in blocks_of_key:
                evictor, owner = evicted_by[k]
                harm[(i, evictor, owner)] += 1
        computed = int(trace.prompt_tokens[i]) + int(trace.output_tokens[i]) - 1
        total, full = -(-computed // bs), computed // bs
        for j in range(len(mine), total):
            if not free:
                preempted[i] = True
                break
            b, _ = free.popitem(last=False)
            if b in key_of:  # eviction
                k = key_of.pop(b)
                if k is not None:
                    blocks_of_key[k].pop(b, None)
                    if not blocks_of_key[k]:
                        del blocks_of_key[k]
                        evicted_by[k] = (i, owner_of.get(b, -1))
                evictions += 1
            ref[b] += 1
            mine.append(b)
            if j < len(keys):
                key_of[b] = keys[j]
                blocks_of_key[keys[j]][b] = None
                owner_of[b] = i
                evicted_by.pop(keys[j], None)
            elif j < full:
                key_of[b] = None
        held[i] = mine

    rows = sorted(harm.items())
    return SimResult(
        policy="lru",
        capacity_blocks=capacity_blocks,
        block_size=bs,
        cached_blocks=cached,
        host_blocks=np.zeros(n, dtype=np.int64),
        preempted=preempted,
        harm_request=np.array([r[0][0] for r in rows], dtype=np.int64),
        harm_evictor=np.array([r[0][1] for r in rows], dtype=np.int64),
        harm_owner=np.array([r[0][2] for r in rows], dtype=np.int64),
        harm_blocks=np.array([r[1] for r in rows], dtype=np.int64),
        evictions=evictions,
        seconds=time.perf_counter() - started,
    )
