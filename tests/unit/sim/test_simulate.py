"""The prefix-cache simulator: fidelity to a recorded vLLM run, the fast pool against the
reference, and every policy on small hand-made traces with known answers."""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np
import pytest
from helpers import ROOT
from pool_reference import simulate_lru
from sim_helpers import make_trace, random_trace

from kvscope.sim.hints import HINT_POLICIES
from kvscope.sim.simulate import POLICIES, simulate
from kvscope.sim.trace import Trace, chain_keys

FIXTURE = ROOT / "tests" / "fixtures" / "replay" / "pathology"


def _pathology() -> tuple[Trace, int]:
    rows = [json.loads(line) for line in (FIXTURE / "requests.jsonl").open()]
    toks = {
        r["request_uuid"]: r["token_ids"]
        for r in map(json.loads, (FIXTURE / "prompt_tokens.jsonl").open())
    }
    t0 = [datetime.fromisoformat(r["timestamp"]).timestamp() for r in rows]
    keys, off = chain_keys([toks[r["request_uuid"]] for r in rows], 128)
    tr = Trace(
        "pathology",
        128,
        tuple(r["request_uuid"] for r in rows),
        np.array([t + (r["queue_ms"] or 0) / 1000 for t, r in zip(t0, rows, strict=True)]),
        np.array([t + r["e2e_ms"] / 1000 for t, r in zip(t0, rows, strict=True)]),
        np.array([r["prompt_tokens"] for r in rows]),
        np.array([r["output_tokens"] for r in rows]),
        keys,
        off,
        tuple(r["agent_id"] for r in rows),
        tuple(r["workflow_run_id"] for r in rows),
        tuple(r["previous_agent_id"] for r in rows),
        np.array([r["cached_tokens"] for r in rows], dtype=float),
    )
    removed = sum(
        e["kind"] == "removed"
        for line in (FIXTURE / "kv_events.jsonl").open()
        for e in json.loads(line)["events"]
    )
    return tr, removed


def test_reference_matches_the_recorded_vllm_run_at_its_real_capacity() -> None:
    tr, removed = _pathology()
    # --num-gpu-blocks-override 28: 27 usable blocks and the null block
    for sim in (simulate_lru(tr, 27), simulate(tr, "lru", 27)):
        assert list(sim.cached_tokens) == list(tr.measured_cached_tokens)
        assert sim.evictions == removed == 18


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert list(a.cached_blocks) == list(b.cached_blocks)
    assert list(a.preempted) == list(b.preempted)
    assert a.evictions == b.evictions
    for f in ("harm_request", "harm_evictor", "harm_owner", "harm_blocks"):
        assert list(getattr(a, f)) == list(getattr(b, f)), f


@pytest.mark.parametrize("seed", range(6))
def test_fast_lru_equals_the_reference_on_concurrent_traces(seed: int) -> None:
    tr = random_trace(seed)
    flat = make_trace([list(tr.blocks_of(i)) for i in range(len(tr))])  # no durations
    for t in (tr, flat):
        for cap in (8, 16, 30):
            _same(simulate_lru(t, cap), simulate(t, "lru", cap))
    assert simulate(tr, "lru", 8).preempted.any()  # the case with pinned blocks is exercised


# b c d a a a b c d a over 3 key slots (4 blocks: each request also takes a blank one)
SEQ = [[2], [3], [4], [1], [1], [1], [2], [3], [4], [1]]


@pytest.mark.parametrize(
    ("policy", "hits"),
    [("lru", 2), ("fifo", 2), ("lfu", 3), ("slru", 3), ("priority", 2), ("belady", 5),
     ("none", 0)],
)  # fmt: skip
def test_known_answers_where_belady_beats_lru_and_lfu(policy: str, hits: int) -> None:
    assert simulate(make_trace(SEQ), policy, 4).cached_blocks.sum() == hits


@pytest.mark.parametrize(("policy", "hits"), [("lru", 2), ("fifo", 2), ("lfu", 3)])
def test_known_answers_on_the_radix_cache(policy: str, hits: int) -> None:
    assert simulate(make_trace(SEQ), policy, 4, engine="sglang").cached_blocks.sum() == hits


def test_radix_evicts_leaves_only_where_the_pool_evicts_a_parent() -> None:
    # 3 blocks; 1 and 2 are inserted by different requests (two radix nodes): the third
    # request evicts one block
    tr = make_trace([[1], [1, 2], [3], [1]])
    assert list(simulate(tr, "fifo", 3).cached_blocks) == [0, 1, 0, 0]  # parent 1 went first
    assert list(simulate(tr, "fifo", 3, engine="sglang").cached_blocks) == [0, 1, 0, 1]
    assert list(simulate(tr, "lru", 3).cached_blocks) == [0, 1, 0, 1]  # tail released first


def test_radix_lru_and_fifo_differ_on_a_re_used_leaf() -> None:
    tr = make_trace([[1], [2], [1], [3], [1]])  # the 4th request evicts one of two leaves
    assert list(simulate(tr, "lru", 3, engine="sglang").cached_blocks) == [0, 0, 1, 0, 1]
    assert list(simulate(tr, "fifo", 3, engine="sglang").cached_blocks) == [0, 0, 1, 0, 0]


def test_priority_keeps_the_blocks_of_important_requests() -> None:
    tr = make_trace([[2], [3], [4], [1], [2]])
    assert simulate(tr, "priority", 4).cached_blocks[-1] == 0  # all equal: LRU
    for engine in ("vllm", "sglang"):
        r = simulate(tr, "priority", 4, engine=engine, priorities=[5, 0, 0, 0, 0])
        assert r.cached_blocks[-1] == 1


def _cycle() -> Trace:
    agents: list[str | None] = ["P", "Q", "R"] * 4
    keys = {"P": [10], "Q": [20], "R": [30]}
    return make_trace(
        [keys[a] for a in agents if a],
        agents=agents,
        workflows=["w"] * 12,
        previous=[None, *agents[:-1]],
    )


def test_workflow_policies_on_an_agent_cycle_larger_than_the_cache() -> None:
    tr = _cycle()  # P -> Q -> R -> P ..., 2 key slots: LRU never hits
    assert simulate(tr, "lru", 3).cached_blocks.sum() == 0
    # steps: at R, P is 1 step away and Q 2: Q goes, P hits next; and so on
    assert list(simulate(tr, "steps-to-execution", 3).cached_blocks) == [0, 0, 0] + [1, 0] * 4 + [1]
    assert list(simulate(tr, "belady", 3).cached_blocks) == [0, 0, 0] + [1, 0] * 4 + [1]
    # predicted: learns P->Q, Q->R, R->P in the first cycle, then protects the next agent
    assert list(simulate(tr, "predicted-next-agent", 3).cached_blocks) == [0, 0, 0, 0] + [1, 0] * 4


def test_every_policy_runs_and_no_cache_never_hits() -> None:
    tr = random_trace(3, n=120)
    pool = [p for p in POLICIES if p not in HINT_POLICIES]  # those are SGLang's (test_priorities)
    hits = {p: int(simulate(tr, p, 20).cached_blocks.sum()) for p in pool}
    assert hits["none"] == 0
    assert hits["belady"] >= max(v for p, v in hits.items() if p != "belady")
    with pytest.raises(ValueError):
        simulate(tr, "belady", 20, engine="sglang")
    with pytest.raises(ValueError):
        simulate(tr, "lru", 20, engine="trt")


def test_heap_keys_without_int64_packing_give_the_same_answers() -> None:
    from kvscope.sim.caches.pool import simulate_pool
    from kvscope.sim.orders.belady import BeladyOrder
    from kvscope.sim.orders.scored import LFUOrder

    class WideBelady(BeladyOrder):
        int_bits = 0

    class WideLFU(LFUOrder):
        int_bits = 0

    for seed in range(3):
        tr = random_trace(seed, n=150)
        _same(simulate_pool(tr, 20, BeladyOrder()), simulate_pool(tr, 20, WideBelady()))
        _same(simulate_pool(tr, 20, LFUOrder()), simulate_pool(tr, 20, WideLFU()))


def test_without_eviction_every_engine_and_policy_hits_the_same() -> None:
    tr = random_trace(5, n=100)
    base = simulate(tr, "lru", 10_000).cached_blocks
    assert base.sum() > 0
    for policy in [p for p in POLICIES if p not in ("lru", "none", *HINT_POLICIES)]:
        assert list(simulate(tr, policy, 10_000).cached_blocks) == list(base), policy
    for policy in ("lru", "fifo", "lfu", "priority", "steps-to-execution-hints"):
        r = simulate(tr, policy, 10_000, engine="sglang")
        assert list(r.cached_blocks) == list(base) and r.evictions == 0, policy
        assert r.engine == "sglang"
