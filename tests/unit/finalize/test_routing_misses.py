"""Routing misses (finalize.routing_misses) and per-replica use (analysis.replica_use), 2 replicas.

Hand-made, with known answers.

Block size 4. S is an 8-token shared prefix (2 blocks); a planner prompt is S + p + 2 tokens
(14), an executor prompt S + e + 1 token (13).

- A planner, r0, t=0: cold. r0 stores S + p at t=10.
- B executor, r1, t=20: r1 is empty, r0 holds S: 8 routing-miss tokens (cached on r0).
  r1 stores S + e at t=30.
- C planner, r1, t=40: r1 serves S (8 cached); p is only on r0: 4 routing-miss tokens.
  r1 stores p at t=50.
- D planner, r0, t=60: all 12 block tokens cached on r0: no miss.
- r1 evicts e at t=65.
- E executor, r0, t=70: S cached on r0 (8); e was evicted on r1: no miss.
- F reviewer, r1, t=80: failed (placed, not measured). G reviewer, t=90: no replica known.
"""

import pytest

from kvscope.analysis import replica_use
from kvscope.finalize import routing_misses as misses_of
from kvscope.finalize.provenance import build_ledger
from kvscope.records.kv_events import KvBatch, KvEvent

S = list(range(100, 108))
p, e = [1, 2, 3, 4], [5, 6, 7, 8]
TOKENS = {
    "A": S + p + [50, 51],
    "B": S + e + [52],
    "C": S + p + [53, 54],
    "D": S + p + [55, 56],
    "E": S + e + [57],
}


def row(uuid, wf, agent, prev, replica, start, cached, status="ok") -> dict:
    prompt = len(TOKENS[uuid]) if uuid in TOKENS else None
    return {
        "request_uuid": uuid, "workflow_run_id": wf, "agent_id": agent,
        "previous_agent_id": prev, "replica": replica, "start_ns": start, "end_ns": start + 9,
        "status": status, "prompt_tokens": prompt, "cached_tokens": cached, "queue_ms": None,
    }  # fmt: skip


ROWS = [
    row("A", "w1", "planner", None, "r0", 0, 0),
    row("B", "w1", "executor", "planner", "r1", 20, 0),
    row("C", "w1", "planner", "executor", "r1", 40, 8),
    row("D", "w2", "planner", None, "r0", 60, 12),
    row("E", "w2", "executor", "planner", "r0", 70, 8),
    row("F", "w2", "reviewer", "executor", "r1", 80, None, status="error"),
    row("G", "w1", "reviewer", "planner", None, 90, None),
]


def stored(hashes: list[int], parent: int | None, tokens: list[int], session: str) -> KvEvent:
    return KvEvent("stored", tuple(hashes), parent, tuple(tokens), 4, "GPU", session)


R0 = [(KvBatch(seq=0, ts_ns=10), stored([1, 2, 3], None, S + p, "A"))]
R1 = [
    (KvBatch(seq=0, ts_ns=30), stored([11, 12, 13], None, S + e, "B")),
    (KvBatch(seq=1, ts_ns=50), stored([14], 12, p, "C")),
    (KvBatch(seq=2, ts_ns=65), KvEvent("removed", (13,))),
]
LEDGERS = {"r0": build_ledger(R0), "r1": build_ledger(R1)}


@pytest.fixture(scope="module")
def misses() -> dict:
    return misses_of.routing_misses(ROWS, TOKENS, LEDGERS)


@pytest.fixture(scope="module")
def filled() -> list[dict]:
    return misses_of.routing_columns(ROWS, TOKENS, LEDGERS)


def test_routing_miss_per_call(misses) -> None:
    got = {u: (m.tokens, m.cached_on) if m else None for u, m in misses.items()}
    assert got == {
        "A": (0, None),  # nothing anywhere yet
        "B": (8, "r0"),  # S was on r0 only
        "C": (4, "r0"),  # S served on r1, p only on r0
        "D": (0, "r1"),  # r1 held all of it too, but so did r0
        "E": (0, "r1"),  # e evicted on r1: r1 had S only, which r0 served
        "F": None,  # failed: not measured
        "G": None,  # no replica
    }


def test_routing_miss_needs_two_replicas_and_one_block_size() -> None:
    one = misses_of.routing_misses(ROWS, TOKENS, {"r0": LEDGERS["r0"]})
    assert set(one.values()) == {None}
    other = [(KvBatch(seq=0, ts_ns=10), KvEvent("stored", (7,), None, tuple(S), 8, "GPU", "A"))]
    with pytest.raises(ValueError, match="block sizes"):
        misses_of.routing_misses(ROWS, TOKENS, {"r0": LEDGERS["r0"], "r1": build_ledger(other)})


def test_routing_miss_of_a_call_without_tokens_is_null() -> None:
    got = misses_of.routing_misses(ROWS, {k: v for k, v in TOKENS.items() if k != "B"}, LEDGERS)
    assert got["B"] is None and got["C"] is not None and got["C"].tokens == 4
    short = misses_of.routing_misses(ROWS, TOKENS | {"B": TOKENS["B"][:-1]}, LEDGERS)
    assert short["B"] is None  # not the engine's count: never used


def test_routing_columns(filled) -> None:
    got = {r["request_uuid"]: (r["routing_miss_tokens"], r["routing_miss_replica"]) for r in filled}
    assert got["B"] == (8, "r0") and got["F"] == (None, None)
    assert [r["request_uuid"] for r in filled] == [r["request_uuid"] for r in ROWS]


def test_routing_by_agent(filled) -> None:
    rows = {s.group: s for s in replica_use.routing_by_agent(filled)}
    assert list(rows) == ["planner", "executor", "reviewer"]
    planner, executor, reviewer = rows["planner"], rows["executor"], rows["reviewer"]
    assert (planner.calls, planner.measured, planner.miss_calls) == (3, 3, 1)
    assert (planner.prompt_tokens, planner.uncached_tokens, planner.routing_miss_tokens) == (
        42, 42 - 20, 4,
    )  # fmt: skip
    assert planner.routing_miss_share == pytest.approx(4 / 42)
    assert (executor.measured, executor.routing_miss_tokens, executor.uncached_tokens) == (2, 8, 18)
    # no measured call: null, never 0
    assert (reviewer.calls, reviewer.measured) == (2, 0)
    assert reviewer.routing_miss_tokens is None and reviewer.routing_miss_share is None


def test_routing_by_transition(filled) -> None:
    rows = {s.group: s for s in replica_use.routing_by_transition(filled)}
    assert list(rows) == [
        "start -> planner",
        "planner -> executor",
        "planner -> reviewer",
        "executor -> planner",
        "executor -> reviewer",
    ]
    assert rows["start -> planner"].routing_miss_tokens == 0
    assert rows["start -> planner"].measured == 2
    assert rows["planner -> executor"].routing_miss_tokens == 8
    assert rows["executor -> planner"].routing_miss_tokens == 4
    assert rows["executor -> reviewer"].routing_miss_tokens is None


def test_per_agent_replica() -> None:
    got = {(x.agent_id, x.replica): x for x in replica_use.per_agent_replica(ROWS)}
    assert list(got) == [
        ("planner", "r0"), ("planner", "r1"), ("executor", "r0"), ("executor", "r1"),
        ("reviewer", "r1"), ("reviewer", None),
    ]  # fmt: skip
    assert got[("planner", "r0")].calls == 2
    assert got[("planner", "r0")].weighted_hit_ratio == pytest.approx(12 / 28)
    assert got[("planner", "r1")].weighted_hit_ratio == pytest.approx(8 / 14)
    assert got[("executor", "r1")].weighted_hit_ratio == 0.0  # measured: a real 0
    failed = got[("reviewer", "r1")]
    assert (failed.calls, failed.failed, failed.measured) == (1, 1, 0)
    assert failed.weighted_hit_ratio is None and failed.prompt_tokens is None


def test_affinity() -> None:
    got = {x.agent_id: x for x in replica_use.affinity(ROWS)}
    planner, executor, reviewer = got["planner"], got["executor"], got["reviewer"]
    assert (planner.calls, planner.replicas, planner.top_replica, planner.top_calls) == (
        3, 2, "r0", 2,
    )  # fmt: skip
    assert planner.affinity == pytest.approx(2 / 3)
    assert planner.workflow_affinity == pytest.approx(2 / 3)  # w1 split, w2 one call
    # a tie goes to the first name; per workflow each executor call is alone
    assert (executor.top_replica, executor.affinity, executor.workflow_affinity) == ("r0", 0.5, 1)
    assert (reviewer.calls, reviewer.affinity) == (1, 1.0)  # G has no replica


def test_affinity_without_any_replica_is_null() -> None:
    rows = [r | {"replica": None} for r in ROWS]
    assert {x.affinity for x in replica_use.affinity(rows)} == {None}


def test_replica_load() -> None:
    got = [
        (x.bucket_start_ns, x.replica, x.agent_id, x.calls, x.prompt_tokens)
        for x in replica_use.replica_load(ROWS, 50)
    ]
    assert got == [
        (0, "r0", "planner", 1, 14),
        (0, "r1", "planner", 1, 14),
        (0, "r1", "executor", 1, 13),
        (50, "r0", "planner", 1, 14),
        (50, "r0", "executor", 1, 13),
        (50, "r1", "reviewer", 1, None),  # failed before a count: null
    ]
    with pytest.raises(ValueError):
        replica_use.replica_load(ROWS, 0)
