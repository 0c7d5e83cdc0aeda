"""The engine's KV cache events, received on a background thread into kv_events.arrow.

Every batch is appended the moment it arrives, as one Arrow record batch (a crash loses nothing;
records.kv_events states the stream's format); at stop the stream is rewritten in large record
batches, atomically (records.base.compact), which finalize reads ~10x faster. A batch the stream
cannot hold (a token id outside [0, 2**32)) is counted as undecodable, not written. Sequence
gaps are recorded with when they were seen; at stop the listener asks the engine's replay socket
for the missing batches and marks what it recovered, so a report can say both how many were lost
live and how many stayed lost. The wire format is in kvscope.engines.kv_events, the stream's
records in kvscope.records.kv_events.
"""

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import zmq

from kvscope.engines.kv_events import decode, replay, subscriber
from kvscope.records.base import ArrowWriter, compact
from kvscope.records.kv_events import (
    BATCHES_SCHEMA,
    LIVE,
    REPLAY,
    KvBatch,
    ListenSummary,
    SeqGap,
)

_REPLAY_BACK = 64  # batches before the first live one asked from replay (the lost head)


class KvEventListener:
    """Receives from start() to stop() and appends every batch to `path` (an Arrow IPC stream:
    records.kv_events.KV_EVENTS_ARROW)."""

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
        self._gaps: list[SeqGap] = []
        self._seqs: set[int] = set()
        self._last: int | None = None
        self._events = self._live = self._bad = 0
        self._started_ns = 0
        self._last_rx = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stream: ArrowWriter[KvBatch] | None = None
        self._summary: ListenSummary | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the listener was already started")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stream = ArrowWriter(self.path, BATCHES_SCHEMA, KvBatch.to_batch)
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
        assert self._stream is not None
        self._stream.close()
        compact(self.path, BATCHES_SCHEMA)  # large batches: read fast by finalize
        with self._lock:
            lost = sum(g.missing for g in self._gaps) - recovered
            self._summary = ListenSummary(
                batches=len(self._seqs), events=self._events, live=self._live,
                recovered=recovered, lost=lost, gaps=tuple(self._gaps), undecodable=self._bad,
            )  # fmt: skip
        return self._summary

    @property
    def gaps(self) -> list[SeqGap]:
        with self._lock:
            return list(self._gaps)

    def _loop(self) -> None:
        try:
            with subscriber(self.endpoint, self.bind) as sock:
                self._ready.set()
                while not self._stop.is_set():
                    if sock.poll(100):
                        self._take(sock.recv_multipart(), LIVE)
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
            if source == LIVE:
                self._live += 1
                if self._last is not None and batch.seq > self._last + 1:
                    self._gaps.append(SeqGap(self._last + 1, batch.seq - 1, received))
                self._last = batch.seq if self._last is None else max(self._last, batch.seq)
            self._write(batch, received, source)

    def _write(self, batch: KvBatch, received_ns: int, source: str) -> bool:
        """Append the batch (under the lock); False (counted undecodable) if it cannot be."""
        assert self._stream is not None
        try:
            self._stream.append(replace(batch, received_ns=received_ns, source=source))
        except ValueError:
            self._bad += 1
            return False
        self._seqs.add(batch.seq)
        self._events += len(batch.events)
        return True

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
                    self._gaps.append(SeqGap(b.seq, b.seq, time.time_ns()))
                    if self._last is None or b.seq > self._last:
                        self._last = b.seq
                got += self._write(b, time.time_ns(), REPLAY)
            self._gaps = [_with_recovered(g, self._seqs) for g in self._gaps]
        return got


def _with_recovered(gap: SeqGap, seqs: set[int]) -> SeqGap:
    n = sum(1 for s in range(gap.first_seq, gap.last_seq + 1) if s in seqs)
    return SeqGap(gap.first_seq, gap.last_seq, gap.seen_ns, n)
