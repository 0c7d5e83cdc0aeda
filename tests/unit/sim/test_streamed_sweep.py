"""LRU at many capacities over a trace read a chunk at a time (sim/streamed_sweep.py): where the
whole-trace sweep (caches/stack.py) answers every capacity, the streamed one gives the same
cached blocks and evictions, whatever the chunks; where it refuses any, the streamed one cannot
stream (the caller reads the trace whole); its window and table follow the largest capacity."""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import replace

import numpy as np
import pytest
from sim_helpers import random_trace
from test_stack_sweep import chains, sequential
from test_streamed import _reads

from kvscope.sim.caches import stack_kernel, stream_kernel
from kvscope.sim.simulate import simulate, sweep_lru
from kvscope.sim.streamed import CannotStream
from kvscope.sim.streamed_sweep import stream_sweep
from kvscope.sim.trace import Trace

ORDERS = ["tail-first", "head-first"]


def _agentless(trace: Trace) -> Trace:
    none = (None,) * len(trace)
    return replace(trace, agents=none, workflows=none, previous_agents=none)


def _cuts(rng: np.random.Generator, n: int) -> list[list[int]]:
    some = sorted(rng.choice(np.arange(1, n), min(9, n - 1), replace=False).tolist())
    return [[], some, list(range(1, n))]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("seed", range(6))
def test_the_streamed_sweep_answers_as_the_whole_one_or_not_at_all(seed: int, order: str) -> None:
    rng = np.random.default_rng(seed)
    traces = [
        _agentless(sequential(random_trace(seed, n=150), seed, whole=0.1 * (seed % 2))),
        chains(seed, n=300, empty=seed % 2 == 1, shared=6 if order == ORDERS[0] else 1),
    ]
    answered = refused = 0
    for trace in traces:
        for caps in ([3, 8, 40], [8, 12, 20, 80, 1000], [9, 16, 64, 4096]):
            found, why = sweep_lru(trace, caps, cache_outputs=False, in_request=order)
            for cuts in _cuts(rng, len(trace)):
                reads = _reads(trace, cuts)
                if why:
                    with pytest.raises(CannotStream):
                        stream_sweep(reads, trace.block_size, caps, in_request=order)
                    refused += 1
                    continue
                got, columns = stream_sweep(reads, trace.block_size, caps, in_request=order)
                assert sorted(got) == caps and sum(len(c.ids) for c in columns) == len(trace)
                for cap in caps:
                    want = simulate(trace, "lru", cap, cache_outputs=False, in_request=order)
                    assert got[cap].cached_blocks.tolist() == want.cached_blocks.tolist(), cap
                    assert got[cap].evictions == want.evictions == found[cap].evictions
                    assert (got[cap].caching, got[cap].in_request) == ("prompt-only", order)
                    assert not got[cap].attributed and not len(got[cap].harm_request)
                answered += 1
    assert answered and (refused or order == ORDERS[0])


def test_what_the_pass_cannot_answer_is_read_whole() -> None:
    trace = chains(2, n=80)
    named = replace(trace, agents=("planner",) * len(trace))
    with pytest.raises(CannotStream, match="names an agent"):
        stream_sweep(_reads(named, []), trace.block_size, [8, 16])
    start = np.arange(len(trace), dtype=float)
    overlapping = replace(trace, start_s=start, end_s=start + 1.5)
    with pytest.raises(CannotStream, match="overlap"):
        stream_sweep(_reads(overlapping, [40]), trace.block_size, [8, 16])
    with pytest.raises(CannotStream, match="more than 2"):
        stream_sweep(_reads(trace, []), trace.block_size, [2, 16])
    repeated = replace(trace, keys=np.where(trace.keys > 10**8, 7, trace.keys).astype(np.uint64))
    with pytest.raises(CannotStream, match=r"repeats a key|cannot hit"):
        stream_sweep(_reads(repeated, []), trace.block_size, [64])


def test_its_memory_follows_the_largest_capacity_not_the_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3,000 requests of fresh keys at capacities up to 48 blocks: the window and the table
    never grow past their first sizes (1,024)."""
    grown: list[int] = []
    grow = stream_kernel.grow_table
    monkeypatch.setattr(stream_kernel, "grow_table", lambda *t: grown.append(t[-1]) or grow(*t))
    trace = chains(4, n=3000)
    got, _ = stream_sweep(_reads(trace, list(range(100, 3000, 100))), trace.block_size, [16, 48])
    assert got[48].evictions > 10 * 48 and not grown


def test_the_kernel_file_names_the_table_code_it_was_compiled_with() -> None:
    """numba's cache checks only the compiled function's file: stack_kernel.sweep_chunk inlines
    stream_kernel's table, whose source hash it holds, so a change there changes it too."""
    source = "".join(
        inspect.getsource(f.py_func)
        for f in (stream_kernel._slot, stream_kernel.find_slot, stream_kernel.delete_slot)
    )
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == stack_kernel.TABLE_SOURCE
