"""The KV event listener on the exact bytes vLLM's publisher sent (recorded fixture).

A PUB socket in the test re-sends the recorded batches, dropping some on purpose; a ROUTER in
the test plays the engine's replay socket (same protocol as vLLM's: [identity, b"", start seq]
in, [identity, b"", topic, seq, payload]... out, then seq -1).
"""

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
import zmq
from helpers import free_port, recorded_frames, restamped

from kvscope.collect.kv_events import KvEventListener
from kvscope.engines.kv_events import decode, signed64
from kvscope.finalize.kvcolumns import columns_of, events_table
from kvscope.records.kv_events import KvBatch, holes, read_batches

FRAMES = recorded_frames()
SEQS = [decode(f).seq for f in FRAMES]


class Replayer:
    """The engine's replay socket: sends the stored batches from the asked seq on."""

    def __init__(self, frames: list[list[bytes]]) -> None:
        self.port = free_port()
        self.frames = frames
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._ready = threading.Event()
        self._thread.start()
        self._ready.wait(5)

    def _serve(self) -> None:
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(f"tcp://127.0.0.1:{self.port}")
        self._ready.set()
        while not self._stop.is_set():
            if not sock.poll(50):
                continue
            ident, _, start = sock.recv_multipart()
            first = int.from_bytes(start, "big")
            for f in self.frames:
                if decode(f).seq >= first:
                    f = restamped(f)  # buffered when published: after the listener started
                    sock.send_multipart([ident, b"", f[0], f[1], f[2]])
            sock.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)


@pytest.fixture
def pub() -> Iterator[tuple[zmq.Socket, int]]:
    port = free_port()
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://127.0.0.1:{port}")
    yield sock, port
    sock.close()


def publish(sock: zmq.Socket, frames: list[list[bytes]]) -> None:
    for f in frames:
        sock.send_multipart(restamped(f))
        time.sleep(0.02)


def listen(port: int, path: Path, replay_port: int | None = None) -> KvEventListener:
    listener = KvEventListener(
        f"tcp://127.0.0.1:{port}", path, drain_s=0.2,
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}" if replay_port else None,
    )  # fmt: skip
    listener.start()
    time.sleep(0.3)  # let the subscription reach the publisher
    return listener


def test_every_batch_is_written_in_order(pub, tmp_path: Path) -> None:
    sock, port = pub
    listener = listen(port, tmp_path / "kv.jsonl")
    publish(sock, FRAMES)
    summary = listener.stop()
    assert (summary.live, summary.lost, summary.gaps) == (len(FRAMES), 0, ())
    rows, bad = read_batches(tmp_path / "kv.jsonl")
    assert bad == 0 and [r.seq for r in rows] == SEQS
    first = decode(FRAMES[0]).events[0]
    assert rows[0].events[0].block_hashes == first.block_hashes


def test_dropped_batches_are_reported(pub, tmp_path: Path) -> None:
    sock, port = pub
    listener = listen(port, tmp_path / "kv.jsonl")
    kept = [f for f in FRAMES if decode(f).seq not in (2, 3)]  # dropped on purpose
    publish(sock, kept)
    summary = listener.stop()
    [gap] = summary.gaps
    assert (gap.first_seq, gap.last_seq, gap.missing, gap.recovered) == (2, 3, 2, 0)
    assert summary.lost == 2 and gap.seen_ns > 0
    rows, _ = read_batches(tmp_path / "kv.jsonl")
    assert holes(rows) == (2, 0)


def test_replay_fills_gaps_and_marks_them(pub, tmp_path: Path) -> None:
    sock, port = pub
    replayer = Replayer(FRAMES)
    try:
        listener = listen(port, tmp_path / "kv.jsonl", replayer.port)
        publish(sock, [f for f in FRAMES if decode(f).seq not in (0, 3)])
        summary = listener.stop()
    finally:
        replayer.close()
    # seq 3 was a gap seen live; seq 0 was lost before the first live batch (the head).
    assert summary.lost == 0 and summary.recovered == 2
    assert {(g.first_seq, g.recovered) for g in summary.gaps} == {(3, 1), (0, 1)}
    rows, _ = read_batches(tmp_path / "kv.jsonl")
    assert [r.seq for r in rows] == SEQS
    assert [r.seq for r in rows if r.source == "replay"] == [0, 3]
    assert holes(rows) == (0, 2)


def test_events_table_has_one_row_per_block(tmp_path: Path) -> None:
    # as the listener writes them and read_batches reads them back
    rows = [KvBatch.from_dict(replace(decode(f), received_ns=0).to_dict()) for f in FRAMES]
    table = events_table(columns_of(rows))
    events = [e for f in FRAMES for e in decode(f).events]
    blocks = sum(len(e.block_hashes) for e in events) + sum(e.kind == "cleared" for e in events)
    assert table.num_rows == blocks
    stored = table.filter(pa.compute.equal(table["kind"], "stored")).to_pylist()
    # Each block of a multi-block BlockStored chains on the one before it.
    first = next(e for e in events if e.kind == "stored" and len(e.block_hashes) > 1)
    chain = [r for r in stored if r["block_hash"] in first.block_hashes]
    assert [r["parent_block_hash"] for r in chain[1:]] == list(first.block_hashes[:-1])
    assert all(r["tokens"] == 128 for r in stored)
    # vLLM carries each request's session_id (the recording sent the agent; the last, none).
    sessions = [r["session_id"] for r in stored]
    assert list(dict.fromkeys(sessions))[:4] == ["planner", "executor", "expresser", "reviewer"]


def test_block_hashes_are_signed_64_bit() -> None:
    assert signed64(2**64 - 1) == -1 and signed64(5) == 5 and signed64(-7) == -7
    hashes = [h for f in FRAMES for e in decode(f).events for h in e.block_hashes]
    assert all(-(2**63) <= h < 2**63 for h in hashes)
    assert any(h < 0 for h in hashes)  # vLLM's unsigned hashes above 2**63 wrapped


def test_garbage_is_counted_not_fatal(pub, tmp_path: Path) -> None:
    sock, port = pub
    listener = listen(port, tmp_path / "kv.jsonl")
    sock.send_multipart([b"kv-events", (0).to_bytes(8, "big"), b"\xc1 not msgpack"])
    publish(sock, FRAMES[:2])
    summary = listener.stop()
    assert summary.undecodable == 1 and summary.live == 2
