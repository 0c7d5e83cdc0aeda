"""Block ledger, per-request provenance and eviction attribution on a hand-made run.

Block size 4. Workflow w1: planner A stores S (8 shared tokens) + its own block `a`; executor B
reuses S, and the step that stores B's block evicts `a`; planner C (next cycle) reuses S and
recomputes `a`. Workflow w2: planner D puts its own block before S (a layout that hides S).
"""

import pyarrow as pa
import pytest

from kvscope.analysis import evictions
from kvscope.analysis.provenance import by_agent
from kvscope.finalize.provenance import build_ledger, provenance
from kvscope.records.blocks import BLOCKS_SCHEMA
from kvscope.records.kv_events import KvBatch, KvEvent

S = list(range(100, 108))
a, b, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]
TOKENS = {
    "A": S + a + [50, 51],
    "B": S + b + [52],
    "C": S + a + [53, 54],
    "D": z + S + [55, 56],
}


def row(uuid: str, wf: str, agent: str, prev: str | None, start: int, cached: int) -> dict:
    return {
        "request_uuid": uuid, "workflow_run_id": wf, "agent_id": agent, "turn_id": 1,
        "previous_agent_id": prev, "start_ns": start, "end_ns": start + 9, "status": "ok",
        "prompt_tokens": len(TOKENS[uuid]), "cached_tokens": cached, "queue_ms": None,
    }  # fmt: skip


ROWS = [
    row("A", "w1", "planner", None, 0, 0),
    row("B", "w1", "executor", "planner", 16, 8),
    row("C", "w1", "planner", "executor", 30, 8),
    row("D", "w2", "planner", None, 50, 0),
]


def stored(hashes: list[int], parent: int | None, tokens: list[int], session: str | None):
    return KvEvent("stored", tuple(hashes), parent, tuple(tokens), 4, "GPU", session)


def batch(seq: int, ts: int) -> KvBatch:
    return KvBatch(seq=seq, ts_ns=ts)


EVENTS = [
    (batch(0, 10), stored([1, 2, 3], None, S + a, "A")),
    (batch(1, 20), KvEvent("removed", (3,))),  # evicted in the step that stores B's block
    (batch(1, 20), stored([4], 2, b, "B")),
    (batch(2, 35), stored([5], 2, a, "C")),  # C recomputes `a`
    (batch(3, 55), stored([10, 11, 12], None, z + S, None)),  # no session: matched by tokens
    (batch(4, 70), KvEvent("cleared")),
]


@pytest.fixture(scope="module")
def result():
    return provenance(ROWS, TOKENS, build_ledger(EVENTS))


def by_uuid(result) -> dict[str, dict]:
    return {r["request_uuid"]: r for r in result.rows}


def test_cached_tokens_are_split_by_who_stored_them(result) -> None:
    r = by_uuid(result)
    assert (r["B"]["cached_cross_agent_tokens"], r["B"]["cached_self_tokens"]) == (8, 0)
    assert (r["C"]["cached_self_tokens"], r["C"]["cached_cross_agent_tokens"]) == (8, 0)
    for u in "ABCD":
        kinds = ("self", "cross_agent", "cross_workflow", "unattributed")
        cached = sum(r[u][f"cached_{k}_tokens"] for k in kinds)
        uncached = sum(r[u][f"uncached_{k}_tokens"] for k in ("evicted", "layout", "cold"))
        assert (cached, uncached) == (r[u]["cached_tokens"], len(TOKENS[u]) - r[u]["cached_tokens"])


def test_uncached_tokens_are_classified(result) -> None:
    r = by_uuid(result)
    assert (r["A"]["uncached_cold_tokens"], r["A"]["uncached_evicted_tokens"]) == (14, 0)
    # C's block `a` was stored by A and evicted before C arrived; its 2-token tail is new.
    assert (r["C"]["uncached_evicted_tokens"], r["C"]["uncached_cold_tokens"]) == (4, 2)
    # D: its own first block is new; S was computed before, but behind another prefix.
    assert (r["D"]["uncached_layout_tokens"], r["D"]["uncached_cold_tokens"]) == (8, 6)


def test_blocks_owner_evictor_and_harm(result) -> None:
    blocks = {b["block_hash"]: b for b in result.blocks}
    victim = blocks[3]
    assert victim["owner_agent_id"] == "planner" and victim["attribution"] == "session_id"
    assert victim["removal"] == "evicted" and victim["residency_ms"] == pytest.approx(10 / 1e6)
    assert (victim["evictor_request_uuid"], victim["evictor_inferred"]) == ("B", "same-step store")
    assert victim["harmful"] and victim["recomputed_tokens"] == 4
    assert victim["needed_by_transition"] == "executor -> planner"
    assert blocks[1]["hits"] == 2  # B and C were served by A's first shared block
    # Stored without a session id: attributed by matching the tokens of the prompt in flight.
    assert (blocks[10]["owner_request_uuid"], blocks[10]["attribution"]) == ("D", "tokens")
    # A reset is not an eviction.
    assert blocks[1]["removal"] == "cleared" and not blocks[1]["harmful"]


def test_eviction_tables(result) -> None:
    blocks = pa.Table.from_pylist(result.blocks, schema=BLOCKS_SCHEMA)
    [cell] = evictions.matrix(blocks).to_pylist()
    assert (cell["evictor_agent_id"], cell["victim_agent_id"]) == ("executor", "planner")
    assert (cell["evictions"], cell["same_workflow"], cell["harmful"]) == (1, 1, 1)
    assert cell["recomputed_tokens"] == 4
    [harm] = evictions.by_transition(blocks)
    assert (harm.transition, harm.recomputed_tokens) == ("executor -> planner", 4)
    summary = evictions.summary(blocks)
    assert (
        summary["blocks_evicted"] == 1
        and summary["harm.executor_to_planner.recomputed_tokens"] == 4
    )
    planner = next(r for r in evictions.residency(blocks) if r.agent_id == "planner")
    assert planner.evicted == 1


def test_per_agent_sums(result) -> None:
    sums = by_agent(result.rows)
    assert sums["planner"]["cached_self_tokens"] == 8
    assert sums["planner"]["uncached_layout_tokens"] == 8
    assert sums["executor"]["cached_cross_agent_tokens"] == 8


def test_requests_without_usable_tokens_stay_null() -> None:
    rows = [row("A", "w1", "planner", None, 0, 0) | {"prompt_tokens": 99}]  # engine disagrees
    res = provenance(rows, TOKENS, build_ledger(EVENTS))
    assert res.rows[0].get("cached_self_tokens") is None
    assert res.skipped == {"kvscope's tokenization differs from the engine's count": 1}


def test_unknown_parent_is_an_orphan() -> None:
    ledger = build_ledger([(batch(0, 1), stored([7], 999, a, "A"))])
    assert ledger.orphan_blocks == 1 and ledger.lives[0].key is None


def test_concurrent_duplicate_is_cold_not_layout() -> None:
    # B starts while A is still computing S: S was never stored before B, but is not layout.
    rows = [row("A", "w1", "planner", None, 0, 0), row("B", "w1", "executor", "planner", 5, 0)]
    res = provenance(rows, TOKENS, build_ledger(EVENTS[:1]))
    b = next(r for r in res.rows if r["request_uuid"] == "B")
    assert (b["uncached_layout_tokens"], b["uncached_cold_tokens"]) == (0, 13)


def test_layout_found_at_a_non_block_offset_and_only_in_earlier_prompts() -> None:
    # E holds [3, 4, 5, 6] at offset 2; F's second block is those tokens, block-aligned in F, so
    # they were computed before behind another prefix (layout); G's [7, 7, 7, 7] was never seen.
    tokens = {"E": [1, 2, 3, 4, 5, 6], "F": [8, 8, 8, 8, 3, 4, 5, 6], "G": [7, 7, 7, 7, 3]}
    rows = [
        {**row("A", "w", "planner", None, t, 0), "request_uuid": u, "prompt_tokens": len(ids)}
        for t, (u, ids) in zip((0, 20, 40), tokens.items(), strict=True)
    ]
    events = [(batch(0, 1), stored([21], None, [1, 2, 3, 4], "E"))]
    r = {x["request_uuid"]: x for x in provenance(rows, tokens, build_ledger(events)).rows}
    assert (r["F"]["uncached_layout_tokens"], r["F"]["uncached_cold_tokens"]) == (4, 4)
    assert (r["G"]["uncached_layout_tokens"], r["G"]["uncached_cold_tokens"]) == (0, 5)
    assert r["E"]["uncached_layout_tokens"] == 0  # its own windows do not count


def test_blocks_of_another_size_or_partial_never_match_prompts() -> None:
    ledger = build_ledger([
        (batch(0, 1), stored([1, 2], None, S[:7], "A")),  # the second block is 3 tokens
        (batch(1, 2), KvEvent("stored", (3,), 2, (9, 9, 9, 9), 4, "GPU", "A")),
    ])  # fmt: skip
    first, partial, child = ledger.lives
    assert first.key is not None and first.key >= 0 and (partial.tokens, child.tokens) == (3, 4)
    assert partial.key == child.key == -1 and ledger.orphan_blocks == 0


def test_an_unknown_queue_time_is_counted_not_taken_as_zero() -> None:
    """Provenance looks blocks up at the request's scheduling time: send time + queue time. An
    unknown queue time leaves the send time and is counted; a known one moves the lookup."""
    prov = provenance(ROWS, TOKENS, build_ledger(EVENTS))
    assert prov.queue_unknown == len(ROWS)
    c = next(r for r in prov.rows if r["request_uuid"] == "C")
    assert c["cached_self_tokens"] == 8 and c["cached_unattributed_tokens"] == 0
    # C queued 45 ns on the engine: scheduled at 75, after the cache was cleared at 70
    late = [r | {"queue_ms": 45e-6} if r["request_uuid"] == "C" else r for r in ROWS]
    prov = provenance(late, TOKENS, build_ledger(EVENTS))
    assert prov.queue_unknown == len(ROWS) - 1
    c = next(r for r in prov.rows if r["request_uuid"] == "C")
    assert c["cached_self_tokens"] == 0 and c["cached_unattributed_tokens"] == 8
