"""Prompt-only caching (simulate(cache_outputs=False), `kvscope replay --prompt-only`): the cache
holds prompts' full blocks only, as kvlint's and prefixlens' simulators do; held against a
reference written here from the rules, not from the simulator."""

from collections import OrderedDict
from dataclasses import replace

import numpy as np
import pytest
from sim_helpers import make_trace

from kvscope.sim.simulate import simulate
from kvscope.sim.trace import Trace


def prompt_only_lru(trace: Trace, capacity: int, head_first: bool = False) -> list[int]:
    """Cached blocks per request of a trace whose requests run one after another, in a vLLM pool
    of `capacity` blocks that holds prompts' full blocks only. Per request: its keys hit in
    order up to the first miss and at most (prompt - 1) // block_size; the rest of its full
    prompt blocks take blank blocks first, then evict the least recently released (a key
    stored twice is held by two blocks, looked up in the first); when it ends its blocks are
    released tail first (its last block the least recent), or with `head_first` first block
    first (as kvlint's and prefixlens' LRU touch a prompt's blocks in order)."""
    free: OrderedDict[int, int] = OrderedDict()  # released block -> its key, oldest first
    where: dict[int, list[int]] = {}  # key -> the blocks holding it, in the order stored
    fresh = iter(range(capacity))  # blocks never used (blank)
    out = []
    for i in np.argsort(trace.start_s, kind="stable").tolist():
        keys = trace.blocks_of(i).tolist()
        limit = (int(trace.prompt_tokens[i]) - 1) // trace.block_size
        mine: list[int] = []
        for k in keys[:limit]:
            if k not in where:
                break
            mine.append(where[k][0])
        out.append(len(mine))
        for b in mine:
            del free[b]
        for k in keys[len(mine) :]:
            b = next(fresh, None)
            if b is None:  # evict the least recently released block
                b, old = free.popitem(last=False)
                where[old].remove(b)
                if not where[old]:
                    del where[old]
            where.setdefault(k, []).append(b)
            mine.append(b)
        pairs = list(zip(mine, keys, strict=True))
        for b, k in pairs if head_first else reversed(pairs):
            free[b] = k
    return out


def _shared_trace(seed: int, n: int = 80, block_size: int = 4) -> Trace:
    """Sequential requests on a few shared prefixes, with partial last blocks and outputs of
    up to four blocks."""
    rng = np.random.default_rng(seed)
    roots = rng.integers(1, 1 << 40, size=4)
    blocks = []
    for _ in range(n):
        k, chain = int(roots[rng.integers(0, 4)]), []
        for _ in range(int(rng.integers(1, 10))):
            k = (k * 31 + int(rng.integers(0, 2)) + 1) % (1 << 62)
            chain.append(k)
        blocks.append(chain)
    trace = make_trace(blocks, block_size=block_size)
    extra = rng.integers(0, block_size, size=n)  # 0: a prompt of whole blocks
    prompt = np.array([len(b) for b in blocks]) * block_size + extra
    return replace(
        trace,
        prompt_tokens=prompt.astype(np.int64),
        output_tokens=rng.integers(1, 4 * block_size, size=n).astype(np.int64),
    )


@pytest.mark.parametrize("seed", range(4))
def test_prompt_only_caching_equals_the_reference(seed: int) -> None:
    trace = _shared_trace(seed)
    changed = orders = False
    for capacity in (10, 14, 20, 30, 60, 1000):
        got = simulate(trace, "lru", capacity, cache_outputs=False)
        assert (got.caching, got.in_request) == ("prompt-only", "tail-first")
        assert got.cached_blocks.tolist() == prompt_only_lru(trace, capacity), capacity
        head = simulate(trace, "lru", capacity, cache_outputs=False, in_request="head-first")
        assert head.in_request == "head-first"
        assert head.cached_blocks.tolist() == prompt_only_lru(trace, capacity, True), capacity
        assert not got.preempted.any()
        engine = simulate(trace, "lru", capacity)
        assert engine.caching == "cache-outputs"
        changed |= engine.cached_blocks.tolist() != got.cached_blocks.tolist()
        orders |= head.cached_blocks.tolist() != got.cached_blocks.tolist()
    assert changed  # output blocks taking space changes what is cached at some capacity
    assert orders  # and so does the in-request order
    # at an unbounded capacity both are every prefix hit
    assert engine.cached_blocks.tolist() == got.cached_blocks.tolist()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_prompt_only_takes_no_space_for_output_or_a_partial_block(engine: str) -> None:
    # 2 full prompt blocks + 1 token, 8 output tokens: 4 blocks with outputs, 2 without
    trace = replace(make_trace([[11, 12], [11, 12]], block_size=4), output_tokens=np.array([8, 8]))
    outputs = simulate(trace, "lru", 3, engine=engine)
    assert outputs.preempted.tolist() == [True, True]
    prompts = simulate(trace, "lru", 3, engine=engine, cache_outputs=False)
    assert prompts.preempted.tolist() == [False, False]
    assert prompts.cached_blocks.tolist() == [0, 2] and prompts.caching == "prompt-only"


def test_head_first_is_refused_where_the_cache_evicts_leaves() -> None:
    trace = make_trace([[11, 12], [11, 12]])
    with pytest.raises(ValueError, match="vllm semantics only"):
        simulate(trace, "lru", 8, engine="sglang", in_request="head-first")
    with pytest.raises(ValueError, match="unknown in-request order"):
        simulate(trace, "lru", 8, in_request="middle")
