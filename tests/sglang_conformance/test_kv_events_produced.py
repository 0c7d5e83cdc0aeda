"""kvscope's KV event decoder and listener on frames SGLang 0.5.23's own publisher sends.

produce_with_sglang.py builds SGLang's ZmqEventPublisher with EventPublisherFactory.create from
the --kv-events-config SGLang parsed out of kvscope's flags, and publishes KVEventBatch objects
made of SGLang's BlockStored / BlockRemoved / AllBlocksCleared. kvscope subscribes where its
endpoints say. Opt-in (`-m sglang`, scripts/test-sglang.sh).
"""

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang_producer import SglangProducer

from kvscope.collect.kv_events import KvEventListener
from kvscope.engines import kv_events
from kvscope.engines.sglang import SglangEngine
from kvscope.records.kv_events import KV_EVENTS_ARROW, KvEvent, events_of, read_batches

pytestmark = pytest.mark.sglang

JOIN_S = 0.5  # for a SUB socket's subscription to reach the publisher (ZMQ slow joiner)
KINDS = {"BlockStored": "stored", "BlockRemoved": "removed", "AllBlocksCleared": "cleared"}
# Block hashes are signed 64-bit in SGLang (hash_str_to_int64): both extremes, and negatives.
H = [2**63 - 1, -(2**63), -42, 1234567890123456789, -987654321, 7]


@pytest.fixture(scope="module")
def publisher(sglang: SglangProducer) -> Iterator[dict[str, Any]]:
    """SGLang's publisher, bound once for these tests: its sequence numbers run on across them
    (and a listener must ignore what the replay buffer holds from before it started)."""
    opened = sglang.call("kv_open")
    try:
        yield opened
    finally:
        sglang.call("kv_close")


def stored(
    engine: SglangEngine, rid: str, hashes: list[int], parent: int | None, first_token: int
) -> dict[str, Any]:
    """SGLang's BlockStored fields for full pages, tagged with kvscope's session_id."""
    body, _ = engine.request_tags(rid, "planner")
    page = engine.config.page_size
    assert page is not None
    tokens = list(range(first_token, first_token + page * len(hashes)))
    return {
        "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
        "token_ids": tokens, "block_size": page, "lora_id": None, "medium": "GPU",
        "session_id": body.get("session_id"),
    }  # fmt: skip


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def expected(event: dict[str, Any]) -> KvEvent:
    """The KvEvent kvscope should decode from what was handed to SGLang."""
    return KvEvent(
        kind=KINDS[event["type"]],  # type: ignore[arg-type]
        block_hashes=tuple(event.get("block_hashes", ())),
        parent_block_hash=event.get("parent_block_hash"),
        token_ids=tuple(event.get("token_ids", ())),
        block_size=event.get("block_size"),
        medium=event.get("medium"),
        session_id=event.get("session_id"),
    )


def workload(engine: SglangEngine) -> list[list[dict[str, Any]]]:
    """Batches: a 2-page store, a child store chained on it, an eviction, a flush."""
    return [
        [stored(engine, "req-a", H[0:2], None, 100)],
        [stored(engine, "req-b", H[2:4], H[1], 500)],  # continues req-a's last block
        [removed(H[2:4]), removed(H[0:1])],
        [{"type": "AllBlocksCleared"}],
        [stored(engine, "req-c", H[4:6], None, 900)],
    ]


def test_frames_decode(sglang: SglangProducer, engine: SglangEngine, publisher: dict) -> None:
    assert publisher["publisher"] == "ZmqEventPublisher"  # kvscope's flags chose zmq
    ep = engine.endpoints()
    assert ep.kv_events is not None
    batches = workload(engine)
    frames = []
    with kv_events.subscriber(ep.kv_events, ep.kv_events_subscriber_binds) as sock:
        time.sleep(JOIN_S)
        sent = [sglang.call("kv_publish", events=b) for b in batches]
        for _ in sent:
            assert sock.poll(5000), "no frame from SGLang's publisher"
            frames.append(sock.recv_multipart())

    first = sent[0]["seq"]
    assert [s["seq"] for s in sent] == list(range(first, first + len(batches)))
    for raw, reply, events in zip(frames, sent, batches, strict=True):
        got = kv_events.decode(raw)
        assert got.seq == reply["seq"]
        assert got.ts_ns == round(reply["ts"] * 1e9)
        assert list(got.events) == [expected(e) for e in events]


def test_listener_gaps_and_replay(
    sglang: SglangProducer, engine: SglangEngine, publisher: dict, tmp_path: Path
) -> None:
    ep = engine.endpoints()
    assert ep.kv_events is not None and ep.kv_events_replay is not None
    path = tmp_path / KV_EVENTS_ARROW
    listener = KvEventListener(
        ep.kv_events, path, bind=ep.kv_events_subscriber_binds, replay_endpoint=ep.kv_events_replay
    )
    b = workload(engine)
    listener.start()
    time.sleep(JOIN_S)
    sent = [
        sglang.call("kv_publish", events=b[0]),
        sglang.call("kv_publish", events=b[1], drop_live=True),  # lost live, kept for replay
        sglang.call("kv_publish", events=b[2]),
        sglang.call("kv_publish", events=b[3], skip_seqs=1),  # the seq before it: lost for good
        sglang.call("kv_publish", events=b[4]),
    ]
    summary = listener.stop()

    seqs = [s["seq"] for s in sent]
    s0 = seqs[0]
    assert seqs == [s0, s0 + 1, s0 + 2, s0 + 4, s0 + 5]
    gaps = [(g.first_seq, g.last_seq, g.missing, g.recovered) for g in summary.gaps]
    assert gaps == [(s0 + 1, s0 + 1, 1, 1), (s0 + 3, s0 + 3, 1, 0)]
    assert (summary.live, summary.recovered, summary.lost) == (4, 1, 1)
    assert summary.batches == 5 and summary.undecodable == 0
    assert summary.events == sum(len(events) for events in b)

    rows, torn = read_batches(path)
    assert torn == 0
    assert [r.seq for r in rows] == seqs
    sources = ["live", "replay", "live", "live", "live"]
    assert {r.seq: r.source for r in rows} == dict(zip(seqs, sources, strict=True))
    for row, reply in zip(rows, sent, strict=True):
        assert row.ts_ns == round(reply["ts"] * 1e9)
    decoded = [event for _, event in events_of(rows)]
    assert decoded == [expected(e) for events in b for e in events]


def test_radix_cache_events(sglang: SglangProducer, engine: SglangEngine, publisher: dict) -> None:
    """Events SGLang's RadixCache makes itself: its block hashes, coalescing and chaining."""
    page = engine.config.page_size
    assert page is not None
    first = list(range(1000, 1000 + 4 * page))
    second = first[: 2 * page] + list(range(5000, 5000 + 2 * page))  # shares 2 pages
    ep = engine.endpoints()
    assert ep.kv_events is not None
    with kv_events.subscriber(ep.kv_events, ep.kv_events_subscriber_binds) as sock:
        time.sleep(JOIN_S)
        # LRU: the oldest leaf, the first request's 2 unshared pages, is what goes
        sent = sglang.call("kv_radix", inserts=[first, second], evict_tokens=2 * page)
        assert sock.poll(5000), "no frame from SGLang's publisher"
        batch = kv_events.decode(sock.recv_multipart())

    assert batch.seq == sent["seq"] and batch.ts_ns == round(sent["ts"] * 1e9)
    assert list(batch.events) == [expected(e) for e in sent["events"]]  # every field
    a, b, gone = batch.events  # SGLang merged each insert's pages into one BlockStored
    assert (a.kind, b.kind, gone.kind) == ("stored", "stored", "removed")
    assert a.token_ids == tuple(first) and a.parent_block_hash is None
    assert b.token_ids == tuple(second[2 * page :])  # only the new pages are stored
    assert b.parent_block_hash == a.block_hashes[1]  # chained on the last shared page
    for e in (a, b):
        assert e.block_size == page and len(e.block_hashes) * page == len(e.token_ids)
    assert sent["evicted"] == 2 * page
    assert gone.block_hashes == a.block_hashes[2:]
