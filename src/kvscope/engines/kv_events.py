"""The KV event wire format SGLang and vLLM publish, and the ZMQ sockets that carry it.

Frames [topic, 8-byte big-endian seq, payload], payload a msgpack array [ts, [event, ...],
dp_rank] whose events are maps tagged by "type": BlockStored / BlockRemoved / AllBlocksCleared.
The live socket is PUB/SUB; the replay socket (ROUTER) sends the batches from a given seq on.
"""

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgpack
import zmq

from kvscope.records.kv_events import Kind, KvBatch, KvEvent

_KINDS: dict[str, Kind] = {
    "BlockStored": "stored",
    "BlockRemoved": "removed",
    "AllBlocksCleared": "cleared",
}
_U64 = 1 << 64


def signed64(h: int) -> int:
    """A block hash as a signed 64-bit int (vLLM sends unsigned, SGLang signed)."""
    h %= _U64
    return h - _U64 if h >= 1 << 63 else h


def decode_event(raw: Any) -> KvEvent | None:
    """One engine event map -> KvEvent; None for a type kvscope does not know."""
    if not isinstance(raw, dict):
        raise ValueError(f"KV event is not a map: {type(raw).__name__}")
    kind = _KINDS.get(raw.get("type", ""))
    if kind is None:
        return None
    parent = raw.get("parent_block_hash")
    return KvEvent(
        kind=kind,
        block_hashes=tuple(signed64(h) for h in raw.get("block_hashes") or ()),
        parent_block_hash=None if parent is None else signed64(parent),
        token_ids=tuple(raw.get("token_ids") or ()),
        block_size=raw.get("block_size"),
        medium=raw.get("medium"),
        session_id=raw.get("session_id"),
    )


def decode(frames: Sequence[bytes]) -> KvBatch:
    """[topic, seq, msgpack [ts, events, dp_rank]] -> KvBatch; ValueError if not that."""
    if len(frames) != 3:
        raise ValueError(f"expected 3 frames, got {len(frames)}")
    seq = int.from_bytes(frames[1], "big", signed=True)
    try:
        batch = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError) as err:
        raise ValueError(f"payload is not msgpack: {err}") from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("payload is not a KV event batch [ts, events, ...]")
    events = tuple(e for e in map(decode_event, batch[1]) if e is not None)
    return KvBatch(seq=seq, ts_ns=round(float(batch[0]) * 1e9), events=events)


@contextmanager
def subscriber(endpoint: str, bind: bool) -> Iterator[zmq.Socket]:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
        yield sock
    finally:
        sock.close()


def receive(sock: zmq.Socket, timeout_s: float) -> list[KvBatch]:
    """Batches until `timeout_s` passes, or 100 ms of quiet once something arrived."""
    batches: list[KvBatch] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(100):
            try:
                batches.append(decode(sock.recv_multipart()))
            except ValueError:
                continue
        elif batches:
            break
    return batches


def replay(endpoint: str, start_seq: int = 0, timeout_s: float = 3.0) -> list[KvBatch]:
    """Batches from seq `start_seq` on, from the engine's replay (ROUTER) socket."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[KvBatch] = []
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", max(start_seq, 0).to_bytes(8, "big")])
        while sock.poll(int(timeout_s * 1000)):
            frames = sock.recv_multipart()[1:]  # drop the empty delimiter
            if len(frames) == 3 and int.from_bytes(frames[1], "big", signed=True) == -1:
                break  # end-of-replay marker
            try:
                out.append(decode(frames))
            except ValueError:
                continue
    finally:
        sock.close()
    return out
