"""The host tier below vLLM's pool and the KVFlow-style prefetch accounting."""

from __future__ import annotations

import pytest
from sim_helpers import make_trace, random_trace

from kvscope.sim.caches.host_tier import split_by_agent
from kvscope.sim.simulate import simulate

SEQ = [[2], [3], [4], [1], [1], [1], [2], [3], [4], [1]]
AGENTS: list[str | None] = list("xyzwwwxyzw")


def test_evicted_keys_are_loaded_back_from_the_host() -> None:
    tr = make_trace(SEQ, agents=AGENTS, previous=[None, *AGENTS[:-1]])
    plain = simulate(tr, "lru", 4)
    assert plain.prefetched_blocks is None
    r = simulate(tr, "lru", 4, host_blocks=1, prefetch=True)
    assert list(r.cached_blocks) == list(plain.cached_blocks)  # the device is unchanged
    # each of b c d a was evicted just before it came back: one host block is enough
    assert list(r.host_blocks) == [0] * 6 + [1] * 4
    assert r.harm_blocks.sum() == 0 < plain.harm_blocks.sum()  # nothing recomputed
    # w -> x is new at request 6; x -> y, y -> z, z -> w were seen in the first round
    assert r.prefetched_blocks is not None
    assert list(r.prefetched_blocks) == [0] * 7 + [1] * 3
    split = split_by_agent(tr, r)
    assert split["w"] == {"device": 2, "host": 1, "prefetched": 1, "missed": 1}
    assert sum(v["device"] + v["host"] + v["missed"] for v in split.values()) == len(tr.keys)


def test_a_host_tier_never_loses_device_hits_and_only_adds_host_hits() -> None:
    for seed in range(3):
        tr = random_trace(seed, n=150)
        base = simulate(tr, "lru", 16)
        for hb in (4, 64):
            r = simulate(tr, "lru", 16, host_blocks=hb)
            assert list(r.cached_blocks) == list(base.cached_blocks)
            assert r.host_blocks.sum() > 0
    with pytest.raises(ValueError):
        simulate(tr, "lru", 16, engine="sglang", host_blocks=8)
