"""The streamed LRU replay (sim/streamed.py) against `simulate` on the whole trace: the same
result whatever the chunks, and a trace out of start order refused for the caller to sort."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sim_helpers import make_trace, random_trace

from kvscope.sim.caches.result import SimResult
from kvscope.sim.inputs.rows import Columns, KeyChunks, Rows
from kvscope.sim.simulate import simulate
from kvscope.sim.streamed import CannotStream, NotInOrder, stream_lru
from kvscope.sim.trace import Trace


def _messy(seed: int, n: int = 120, bs: int = 4) -> Trace:
    """Unchained keys from a small alphabet (repeats within a prompt, two copies of a key in the
    pool), ties in start times, requests without duration and long-lived ones, prompts with and
    without a partial block, outputs over blocks."""
    rng = np.random.default_rng(seed)
    blocks = [rng.choice(14, size=int(k)).tolist() for k in rng.integers(0, 9, size=n)]
    start = np.sort(rng.integers(0, n // 2, size=n).astype(float))  # ties
    life = np.where(rng.random(n) < 0.3, 0.0, rng.exponential(3.0, size=n))
    life[rng.random(n) < 0.05] = 1e3  # running to the end
    tr = make_trace(blocks, start=start.tolist(), end=(start + life).tolist(), block_size=bs)
    prompt = np.maximum(np.diff(tr.offsets) * bs + rng.integers(-1, bs, size=n), 0)
    output = rng.integers(0, 3 * bs, size=n)
    return Trace(**{**tr.__dict__, "prompt_tokens": prompt, "output_tokens": output})


def _reads(tr: Trace, cuts: list[int]) -> Iterator[tuple[Columns, np.ndarray, np.ndarray]]:
    """The trace as a reader yields it: Columns (times in ms), keys flat, keys per request."""
    edges = [0, *cuts, len(tr)]
    for lo, hi in itertools.pairwise(edges):
        columns = Columns(
            list(tr.request_ids[lo:hi]), tr.start_s[lo:hi] * 1e3, tr.end_s[lo:hi] * 1e3,
            tr.prompt_tokens[lo:hi], tr.output_tokens[lo:hi], list(tr.agents[lo:hi]),
            list(tr.workflows[lo:hi]), list(tr.previous_agents[lo:hi]),
        )  # fmt: skip
        keys = tr.keys[tr.offsets[lo] : tr.offsets[hi]]
        yield columns, keys, np.diff(tr.offsets[lo : hi + 1])


def _same(a: SimResult, b: SimResult) -> None:
    assert (a.policy, a.capacity_blocks, a.caching, a.in_request) == (
        b.policy, b.capacity_blocks, b.caching, b.in_request,
    )  # fmt: skip
    assert a.cached_blocks.tolist() == b.cached_blocks.tolist()
    assert a.preempted.tolist() == b.preempted.tolist()
    assert a.evictions == b.evictions
    for f in ("harm_request", "harm_evictor", "harm_owner", "harm_blocks"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cache_outputs", [True, False])
@pytest.mark.parametrize("in_request", ["tail-first", "head-first"])
def test_streamed_lru_equals_simulate_whatever_the_chunks(
    seed: int, cache_outputs: bool, in_request: str
) -> None:
    rng = np.random.default_rng(seed)
    harmed = evicted = preempted = 0
    for made in (random_trace(seed, n=120), _messy(seed)):
        # its clock as a reader's rows give it: ms read, seconds replayed
        tr = replace(made, start_s=made.start_s * 1e3 / 1e3, end_s=made.end_s * 1e3 / 1e3)
        n = len(tr)
        for cap in (2, 7, 25, 10_000):
            want = simulate(
                tr, "lru", cap, cache_outputs=cache_outputs, in_request=in_request, compiled=True
            )
            for cuts in ([], sorted(rng.choice(np.arange(1, n), 9, replace=False).tolist()),
                         list(range(1, n))):  # fmt: skip
                got, columns = stream_lru(
                    _reads(tr, cuts), tr.block_size, cap,
                    cache_outputs=cache_outputs, in_request=in_request,
                )  # fmt: skip
                _same(got, want)
                assert sum(len(c.ids) for c in columns) == n
            harmed += len(want.harm_request)
            evicted += want.evictions
            preempted += int(want.preempted.sum())
    assert harmed and evicted and preempted  # the cases are exercised


def _permuted(tr: Trace, perm: np.ndarray) -> Trace:
    """`tr`'s requests in the order `perm` (a file out of start order)."""
    keys = [tr.blocks_of(int(i)) for i in perm]
    offsets = np.zeros(len(perm) + 1, dtype=np.int64)
    np.cumsum([len(k) for k in keys], out=offsets[1:])
    per = {"request_ids": tr.request_ids, "agents": tr.agents, "workflows": tr.workflows,
           "previous_agents": tr.previous_agents}  # fmt: skip
    return replace(
        tr, **{k: tuple(v[i] for i in perm) for k, v in per.items()},
        start_s=tr.start_s[perm], end_s=tr.end_s[perm], prompt_tokens=tr.prompt_tokens[perm],
        output_tokens=tr.output_tokens[perm], keys=np.concatenate(keys), offsets=offsets,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_a_file_out_of_order_within_a_window_is_replayed_in_start_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    made = _messy(seed)
    tr = replace(made, start_s=made.start_s * 1e3 / 1e3, end_s=made.end_s * 1e3 / 1e3)
    n = len(tr)
    perm = np.argsort(np.arange(n) + rng.integers(0, 6, size=n), kind="stable")  # local moves
    assert (np.diff(tr.start_s[perm]) < 0).any()
    cuts = list(range(10, n, 10))
    file = _permuted(tr, perm)  # as read whole: sorted by start, ties in file order
    read = _permuted(file, np.argsort(file.start_s, kind="stable"))
    for cap in (3, 9, 40):
        want = simulate(read, "lru", cap, compiled=True)
        got, columns = stream_lru(_reads(file, cuts), tr.block_size, cap)
        _same(got, want)
        rows, none = Rows(), KeyChunks()
        for c in columns:
            rows.add(c)
            none.add_flat(np.zeros(0, np.uint64), np.zeros(len(c.ids), np.int64))
        assert rows.trace(Path("t"), 4, none).request_ids == read.request_ids


@pytest.mark.parametrize("window", [1, 2, 4])
def test_a_start_before_one_already_replayed_is_refused(window: int) -> None:
    """A request may come up to `window` parts late and still be sorted in; later, refused."""
    n = 12
    for late in range(1, n):  # the last request starts before request `late`, read one a part
        tr = make_trace([[k + 1] for k in range(n)], start=[*range(n - 1), late - 0.5])
        parts = _reads(tr, list(range(1, n)))
        if n - 1 - late <= window:
            got, _ = stream_lru(parts, 4, 8, window=window)  # within the window: sorted
            read = _permuted(tr, np.argsort(tr.start_s, kind="stable"))
            _same(got, simulate(read, "lru", 8, compiled=True))
        else:
            with pytest.raises(NotInOrder):
                stream_lru(parts, 4, 8, window=window)


def test_no_requests() -> None:
    result, columns = stream_lru(iter([]), 4, 8)
    assert len(result.cached_blocks) == 0 and columns == []


@pytest.mark.parametrize("seed", range(3))
def test_without_attribution_the_same_hits_and_no_harm_rows(seed: int) -> None:
    made = _messy(seed)  # no agents, no workflows
    tr = replace(made, start_s=made.start_s * 1e3 / 1e3, end_s=made.end_s * 1e3 / 1e3)
    for cap in (3, 9, 40):
        want = simulate(tr, "lru", cap, compiled=True)
        got, _ = stream_lru(_reads(tr, [17, 50]), tr.block_size, cap, attribute=False)
        assert got.cached_blocks.tolist() == want.cached_blocks.tolist()
        assert got.preempted.tolist() == want.preempted.tolist()
        assert got.evictions == want.evictions
        assert not got.attributed and len(got.harm_request) == 0
    named = random_trace(seed)  # names agents: its harm would be reported
    with pytest.raises(CannotStream):
        stream_lru(_reads(named, []), named.block_size, 8, attribute=False)
