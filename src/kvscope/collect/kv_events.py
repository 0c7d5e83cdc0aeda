"""The engine's KV cache events (ZMQ multipart, msgpack), received on a background thread.

SGLang and vLLM publish the same wire format: frames [topic, 8-byte big-endian seq, payload],
payload a msgpack array [ts, [event, ...], dp_rank] whose events are maps tagged by "type":
BlockStored / BlockRemoved / AllBlocksCleared. Every batch is appended to a JSONL file the moment
it arrives (a crash loses nothing). Sequence gaps are recorded with when they were seen; at stop
the listener asks the engine's replay socket for the missing batches and marks what it recovered,
so a report can say both how many were lost live and how many stayed lost.
"""

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgpack
import pyarrow as pa
import zmq

from kvscope.store import read_jsonl

Kind = Literal["stored", "removed", "cleared"]
_KINDS: dict[str, Kind] = {
    "BlockStored": "stored",
    "BlockRemoved": "removed",
    "AllBlocksCleared": "cleared",
}
_U64 = 1 << 64
_REPLAY_BACK = 64  # batches before the first live one asked from replay (the lost head)


def signed64(h: int) -> int:
    """A block hash as a signed 64-bit int (vLLM sends unsigned, SGLang signed)."""
    h %= _U64
    return h - _U64 if h >= 1 << 63 else h


@dataclass(frozen=True)
class KvEvent:
    kind: Kind
    block_hashes: tuple[int, ...] = ()  # signed 64-bit
    parent_block_hash: int | None = None  # of the first block; each later one chains on the last
    token_ids: tuple[int, ...] = ()  # all blocks' tokens, block_size each
    block_size: int | None = None
    medium: str | None = None
    session_id: str | None = None  # the request's session_id (kvscope sends the request_uuid)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass(frozen=True)
class EventBatch:
    seq: int
    ts_ns: int  # when the engine published it (its wall clock)
    events: tuple[KvEvent, ...]


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


def decode(frames: Sequence[bytes]) -> EventBatch:
    """[topic, seq, msgpack [ts, events, dp_rank]] -> EventBatch; ValueError if not that."""
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
    return EventBatch(seq=seq, ts_ns=round(float(batch[0]) * 1e9), events=events)


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


def receive(sock: zmq.Socket, timeout_s: float) -> list[EventBatch]:
    """Batches until `timeout_s` passes, or 100 ms of quiet once something arrived."""
    batches: list[EventBatch] = []
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


def replay(endpoint: str, start_seq: int = 0, timeout_s: float = 3.0) -> list[EventBatch]:
    """Batches from seq `start_seq` on, from the engine's replay (ROUTER) socket."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[EventBatch] = []
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


@dataclass(frozen=True)
class Gap:
    first_seq: int  # missing seqs first_seq .. last_seq
    last_seq: int
    seen_ns: int  # when the listener noticed (the next batch arrived), kvscope's clock
    recovered: int = 0  # of them, filled from the engine's replay socket at stop

    @property
    def missing(self) -> int:
        return self.last_seq - self.first_seq + 1


@dataclass(frozen=True)
class ListenSummary:
    batches: int  # live + recovered
    events: int
    live: int
    recovered: int
    lost: int  # missing after replay: never papered over
    gaps: tuple[Gap, ...] = field(default_factory=tuple)
    undecodable: int = 0


class KvEventListener:
    """Receives from start() to stop() and appends every batch to `path` (JSONL)."""

    def __init__(
        self,
        endpoint: str,
        path: Path,
        *,
        bind: bool = False,
        replay_endpoint: str | None = None,
        drain_s: float = 0.5,
    ) -> None:
        self.endpoint, self.path, self.bind = endpoint, path, bind
        self.replay_endpoint, self.drain_s = replay_endpoint, drain_s
        self._gaps: list[Gap] = []
        self._seqs: set[int] = set()
        self._last: int | None = None
        self._events = self._live = self._bad = 0
        self._started_ns = 0
        self._last_rx = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._file: Any = None
        self._summary: ListenSummary | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the listener was already started")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._started_ns = time.time_ns()
        self._thread = threading.Thread(target=self._loop, name="kvscope-kv-events", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)
        if self._error is not None:
            raise self._error

    def stop(self) -> ListenSummary:
        if self._thread is None:
            raise RuntimeError("the listener was not started")
        if self._summary is not None:
            return self._summary
        # The engine publishes after each scheduler step: wait for a short quiet spell.
        deadline = time.monotonic() + 5 * self.drain_s
        while time.monotonic() < deadline and time.monotonic() - self._last_rx < self.drain_s:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(2.0)
        recovered = self._recover() if self.replay_endpoint else 0
        self._file.close()
        with self._lock:
            lost = sum(g.missing for g in self._gaps) - recovered
            self._summary = ListenSummary(
                batches=len(self._seqs), events=self._events, live=self._live,
                recovered=recovered, lost=lost, gaps=tuple(self._gaps), undecodable=self._bad,
            )  # fmt: skip
        return self._summary

    @property
    def gaps(self) -> list[Gap]:
        with self._lock:
            return list(self._gaps)

    def _loop(self) -> None:
        try:
            with subscriber(self.endpoint, self.bind) as sock:
                self._ready.set()
                while not self._stop.is_set():
                    if sock.poll(100):
                        self._take(sock.recv_multipart(), "live")
        except zmq.ZMQError as err:
            self._error = err
            self._ready.set()

    def _take(self, frames: Sequence[bytes], source: str) -> None:
        received = time.time_ns()
        try:
            batch = decode(frames)
        except ValueError:
            with self._lock:
                self._bad += 1
            return
        self._last_rx = time.monotonic()
        with self._lock:
            if batch.seq in self._seqs:
                return
            if source == "live":
                self._live += 1
                if self._last is not None and batch.seq > self._last + 1:
                    self._gaps.append(Gap(self._last + 1, batch.seq - 1, received))
                self._last = batch.seq if self._last is None else max(self._last, batch.seq)
            self._write(batch, received, source)

    def _write(self, batch: EventBatch, received_ns: int, source: str) -> None:
        self._seqs.add(batch.seq)
        self._events += len(batch.events)
        row = {
            "seq": batch.seq, "ts_ns": batch.ts_ns, "received_ns": received_ns, "source": source,
            "events": [e.to_dict() for e in batch.events],
        }  # fmt: skip
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._file.flush()

    def _recover(self) -> int:
        """Missing batches from the replay socket: gaps, and the head lost before the first."""
        with self._lock:
            first = min(self._seqs) if self._seqs else None
        start = 0 if first is None else max(first - _REPLAY_BACK, 0)
        try:
            batches = replay(self.replay_endpoint or "", start)
        except zmq.ZMQError:
            return 0
        got = 0
        with self._lock:
            for b in batches:
                if b.seq in self._seqs:
                    continue
                head = first is None or b.seq < first
                if head and b.ts_ns < self._started_ns:
                    continue  # published before this run started listening
                if head:
                    # Lost before the subscription took effect: a gap seen only now.
                    self._gaps.append(Gap(b.seq, b.seq, time.time_ns()))
                    if self._last is None or b.seq > self._last:
                        self._last = b.seq
                self._write(b, time.time_ns(), "replay")
                got += 1
            self._gaps = [_with_recovered(g, self._seqs) for g in self._gaps]
        return got


def _with_recovered(gap: Gap, seqs: set[int]) -> Gap:
    n = sum(1 for s in range(gap.first_seq, gap.last_seq + 1) if s in seqs)
    return Gap(gap.first_seq, gap.last_seq, gap.seen_ns, n)


def read_batches(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The listener's JSONL rows in seq order, and how many torn lines were skipped."""
    rows, bad = read_jsonl(path)
    return sorted(rows, key=lambda r: r["seq"]), bad


def summary_dict(s: ListenSummary) -> dict[str, Any]:
    d = asdict(s)
    d["gaps"] = [asdict(g) | {"missing": g.missing} for g in s.gaps]
    return d


def events_of(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], KvEvent]]:
    """(batch row, event) pairs from read_batches rows, in publish order."""
    for row in rows:
        for e in row["events"]:
            yield row, KvEvent(
                kind=e["kind"], block_hashes=tuple(e["block_hashes"]),
                parent_block_hash=e["parent_block_hash"], token_ids=tuple(e["token_ids"]),
                block_size=e["block_size"], medium=e["medium"], session_id=e["session_id"],
            )  # fmt: skip


EVENTS_SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("ts_ns", pa.int64(), nullable=False),  # engine's publish time
    pa.field("received_ns", pa.int64(), nullable=False),
    pa.field("source", pa.string(), nullable=False),  # live | replay
    pa.field("kind", pa.string(), nullable=False),  # stored | removed | cleared
    pa.field("block_hash", pa.int64()),  # null for cleared
    pa.field("parent_block_hash", pa.int64()),  # stored: the block it chains on
    pa.field("tokens", pa.int32()),  # stored: tokens in the block
    pa.field("session_id", pa.string()),
    pa.field("medium", pa.string()),
])  # fmt: skip


def to_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """One row per block event (a BlockStored of 4 blocks gives 4 rows), in publish order."""
    cols: dict[str, list[Any]] = {f.name: [] for f in EVENTS_SCHEMA}

    def add(row: dict[str, Any], e: KvEvent, h: int | None, parent: int | None, n: int | None):
        values = (row["seq"], row["ts_ns"], row["received_ns"], row["source"], e.kind, h, parent,
                  n, e.session_id, e.medium)  # fmt: skip
        for name, v in zip(cols, values, strict=True):
            cols[name].append(v)

    for row, e in events_of(rows):
        if e.kind == "cleared":
            add(row, e, None, None, None)
            continue
        parent, size = e.parent_block_hash, e.block_size or 0
        for i, h in enumerate(e.block_hashes):
            if e.kind == "stored":
                add(row, e, h, parent, len(e.token_ids[i * size : (i + 1) * size]))
                parent = h
            else:
                add(row, e, h, None, None)
    return pa.Table.from_pydict(cols, schema=EVENTS_SCHEMA)


def holes(rows: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(missing seqs between the first and last batch kept, batches that came from replay)."""
    seqs = sorted({r["seq"] for r in rows})
    missing = (seqs[-1] - seqs[0] + 1 - len(seqs)) if seqs else 0
    return missing, sum(r["source"] == "replay" for r in rows)
