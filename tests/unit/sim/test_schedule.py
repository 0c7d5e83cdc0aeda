"""The replay's request order: when the engine scheduled each call, and the engine's own order
inside one step (from its KV events), checked on hand-made rows and on a recorded fan-out run."""

from typing import Any

import numpy as np
import pytest
from helpers import ROOT

from kvscope.sim.inputs import schedule
from kvscope.sim.inputs.schedule import (
    SAME_STEP_S,
    first_stores,
    scheduled_start,
    scheduled_starts,
)
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.results.fidelity import fidelity
from kvscope.sim.simulate import simulate

FANOUT = ROOT / "tests" / "fixtures" / "replay" / "fanout"
PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology"


def row(uuid: str, sent_ms: float, **timing: float | None) -> dict[str, Any]:
    return {"request_uuid": uuid, "start_ns": int(sent_ms * 1e6), **timing}


def test_the_scheduled_time_is_the_first_token_less_the_engines_prefill() -> None:
    assert scheduled_start(row("a", 1000, ttft_ms=700, prefill_ms=200)) == pytest.approx(1.5)
    # without the engine's prefill: its queue time; without that: when it was sent
    assert scheduled_start(row("a", 1000, ttft_ms=700, queue_ms=30)) == pytest.approx(1.03)
    assert scheduled_start(row("a", 1000, ttft_ms=None, prefill_ms=None)) == pytest.approx(1.0)
    # a prefill longer than the TTFT is not a clock to trust
    assert scheduled_start(row("a", 1000, ttft_ms=100, prefill_ms=200)) == pytest.approx(1.0)


def test_calls_in_one_step_take_the_order_the_engine_stored_their_blocks() -> None:
    # b was sent 2 ms after a, both scheduled in one step; the engine stored b's blocks first
    rows = [
        row("a", 0, ttft_ms=600.4, prefill_ms=500),
        row("b", 2, ttft_ms=598, prefill_ms=500),
    ]
    starts = scheduled_starts(rows)  # no KV events: sending order
    assert starts[0] < starts[1]
    starts = scheduled_starts(rows, {"a": (7, 11), "b": (7, 10)})
    assert starts[1] < starts[0]
    assert sorted(starts) == sorted(scheduled_starts(rows))  # the step's times, handed out again


def test_a_call_that_stored_nothing_follows_the_peer_whose_block_it_hit() -> None:
    rows = [row(u, t, ttft_ms=500, prefill_ms=400) for u, t in (("a", 0), ("b", 1), ("c", 2))]
    stores = {"b": (3, 5), "c": (3, 6)}  # a stored nothing in the step: all its blocks were hits
    starts = scheduled_starts(rows, stores, after=lambda i, j: (i, j) == (0, 2))
    assert list(np.argsort(starts)) == [1, 2, 0]
    starts = scheduled_starts(rows, stores, after=lambda i, j: False)
    assert list(np.argsort(starts)) == [0, 1, 2]  # nothing it needed: its sending place


def test_a_store_in_a_later_batch_does_not_reorder_the_step() -> None:
    # a's first store is an output block many steps later; b and c stored in the step's batch
    rows = [row(u, t, ttft_ms=500, prefill_ms=400) for u, t in (("a", 0), ("b", 1), ("c", 2))]
    starts = scheduled_starts(rows, {"a": (9, 40), "b": (3, 5), "c": (3, 4)})
    assert list(np.argsort(starts)) == [0, 2, 1]  # a keeps its sending place; c before b


def test_calls_in_different_steps_keep_their_scheduled_order() -> None:
    gap_ms = SAME_STEP_S * 1e3 * 2
    rows = [row("a", 0, ttft_ms=500, prefill_ms=400), row("b", gap_ms, ttft_ms=500, prefill_ms=400)]
    starts = scheduled_starts(rows, {"a": (3, 9), "b": (3, 1)})
    assert starts[0] < starts[1]


def test_first_stores_reads_the_engines_kv_events_per_request() -> None:
    first = first_stores(PATHOLOGY)
    trace = load_source(PATHOLOGY).trace
    assert set(first) == set(trace.request_ids)
    # one sequential workflow: the engine stored in the calls' own order, one batch each
    assert sorted(trace.request_ids, key=lambda u: first[u][1]) == list(trace.request_ids)
    assert len({seq for seq, _ in first.values()}) == len(first)
    assert first_stores(ROOT / "tests" / "fixtures") == {}  # no KV events: nothing to go by


def test_a_recorded_fan_out_replays_exactly_in_the_engines_order(monkeypatch) -> None:
    source = load_source(FANOUT)
    trace = source.trace
    blocks = trace.capacity_tokens // trace.block_size
    fid = fidelity(source, simulate(trace, "lru", blocks))
    assert fid is not None and fid.exact_share == 1.0 and fid.meets_targets
    # replayed in the order the client sent them, the fan-out pairs swap their hits
    monkeypatch.setattr(
        schedule, "scheduled_starts", lambda rows, *_: np.array([r["start_ns"] / 1e9 for r in rows])
    )
    sent = load_source(FANOUT)
    off = fidelity(sent, simulate(sent.trace, "lru", blocks))
    assert off is not None and not off.meets_targets
    assert {r.split(" (")[0] for m in off.mismatches for r in m.reasons} == {"timing"}


def reference_order(group: list[int], sent: list[float], at: list[Any], after: Any) -> list[int]:
    """The module doc's rules 1 and 2 as list insertions, one call at a time (the oracle)."""
    seqs = [at[i][0] for i in group if at[i] is not None]
    batch = min(seqs) if seqs else None
    stored = sorted((i for i in group if at[i] is not None and at[i][0] == batch),
                    key=lambda i: at[i][1])  # fmt: skip
    placed = list(stored)
    for i in sorted((i for i in group if i not in stored), key=lambda i: sent[i]):
        peers = [k for k, j in enumerate(placed) if j in stored and after and after(i, j)]
        if peers:
            placed.insert(peers[-1] + 1, i)
        else:
            later = [k for k, j in enumerate(placed) if sent[j] > sent[i]]
            placed.insert(later[0] if later else len(placed), i)
    return placed


@pytest.mark.parametrize("seed", range(40))
def test_a_step_is_ordered_as_the_rules_place_one_call_at_a_time(seed: int) -> None:
    """Random steps (sending ties, two KV event batches, calls that stored nothing, hits on
    some stored calls): the same order as the rules applied by list insertion."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    group = rng.permutation(n).tolist()
    sent = rng.integers(0, 12, n).astype(float).tolist()
    at = [None if rng.random() < 0.5 else (int(rng.integers(1, 3)), int(rng.integers(0, 1000)))
          for _ in range(n)]  # fmt: skip
    hits = rng.random((n, n)) < 0.15
    after = None if seed % 5 == 0 else (lambda i, j: bool(hits[i, j]))
    assert schedule.step_order(group, sent, at, after) == reference_order(group, sent, at, after)
