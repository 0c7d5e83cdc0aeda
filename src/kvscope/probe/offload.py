"""What a call's row costs, paid off the app's hot path: one background thread, a bounded queue.

The app's thread (often one event loop serving hundreds of workflows) only measures its calls and
hands each finished one over here as a job (probe/wire.py's InFlight.finish); the worker thread
builds its row (usage, timings, the prompt's token ids through the chat template and tokenizer),
serializes it and writes it to the streams (probe/streams.py). As OpenTelemetry's batch span
processor does, the hot path is a queue append.

Nothing is lost, and nothing is dropped silently:

- a full queue (`maxsize` jobs waiting: the worker falls behind) never blocks the app: `submit`
  says no and the caller runs the job itself, inline, as kvscope did before; counted (`inline`);
- a job that raises is logged with its traceback and counted (`failed`, the first `error` kept);
  the worker goes on with the next one;
- a worker thread that dies (a BaseException) is said so (`died`, logged); the jobs it left are run
  by `close`, the ones submitted later inline by their caller;
- `close` (the capture's close, or the interpreter's exit in a profiled program) runs what is
  still queued before it returns;
- in a forked child the worker thread does not exist: jobs there are run inline (not counted).
  A fork waits for the worker's job in progress (os.register_at_fork): a child forked while the
  worker was inside pyarrow or numpy would inherit their locks held, and hang on its first row.

The worker holds the GIL while it works (the tokenizer does too), so it shares the app's CPU; it
yields it after each job, and the loop gets its calls' replies without waiting for their rows.
"""

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

Job = Callable[[], None]
MAXSIZE = 2048  # jobs waiting; a job holds one call's request body and reply (a few KB each)
CLOSE_TIMEOUT_S = 60.0
_STOP = object()


@dataclass
class OffloadStats:
    """What the worker did: `offloaded` jobs it took; `inline`: jobs their caller ran because
    the queue was full (or the worker was gone); `failed`: jobs that raised (`error`: the
    first one's); `died`: why the worker thread ended early (None: it did not)."""

    offloaded: int = 0
    inline: int = 0
    failed: int = 0
    error: str | None = None
    died: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add(self, other: "OffloadStats") -> "OffloadStats":
        return OffloadStats(
            self.offloaded + other.offloaded,
            self.inline + other.inline,
            self.failed + other.failed,
            self.error or other.error,
            self.died or other.died,
        )


class Offload:
    """A worker thread (a daemon: the interpreter's exit waits for `close`, not for it) running
    the jobs `submit` hands it, in order."""

    def __init__(self, name: str = "kvscope-offload", maxsize: int = MAXSIZE) -> None:
        self.stats = OffloadStats()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize)
        self._pid = os.getpid()
        self._closed = False
        self._busy = threading.Lock()  # held by the worker while it runs a job, and by a fork
        self._paused = False  # this thread holds _busy for a fork
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def submit(self, job: Job) -> bool:
        """Queue `job` for the worker; False when the caller must run it itself: the queue is
        full (counted), the worker is gone (counted) or closed, or this is a forked child."""
        if os.getpid() != self._pid or self._closed:
            return False
        if self.stats.died is None:
            try:
                self._queue.put_nowait(job)
                return True
            except queue.Full:
                pass
        self.stats.inline += 1
        return False

    def flush(self) -> None:
        """Wait until every job submitted so far has run (by the worker, or here if it died)."""
        if os.getpid() != self._pid:
            return
        done = self._queue.all_tasks_done
        with done:
            while self._queue.unfinished_tasks and self._thread.is_alive():
                done.wait(0.1)
        self._drain()  # what a dead worker left

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> OffloadStats:
        """Run what is queued, stop the worker (once); what it did. A worker still busy after
        `timeout_s` (a job that hangs) is left, and the rest of the queue is run here."""
        if self._closed or os.getpid() != self._pid:
            return self.stats
        self._closed = True
        if self._thread.is_alive():
            try:  # waits only while the worker works off a full queue
                self._queue.put(_STOP, timeout=timeout_s)
                self._thread.join(timeout_s)
            except queue.Full:
                pass
            if self._thread.is_alive():
                self.stats.died = f"still busy {timeout_s:.0f} s after close"
                log.error("kvscope: the row writer thread is %s", self.stats.died)
        self._drain()  # what a dead worker left
        return self.stats

    def _run(self) -> None:
        try:
            while True:
                job = self._queue.get()
                try:
                    if job is _STOP:
                        return
                    self.stats.offloaded += 1
                    with self._busy:
                        self._call(job)
                finally:
                    self._queue.task_done()
                time.sleep(0)  # hand the GIL to the app's thread if it waits for it
        except BaseException as err:  # the thread ends: say so, and let close() run the rest
            self.stats.failed += 1  # the job it was running
            self.stats.error = self.stats.error or f"{type(err).__name__}: {err}"
            self.stats.died = f"{type(err).__name__}: {err}"
            log.error("kvscope: the row writer thread stopped (%s); rows are written inline "
                      "from now on", self.stats.died, exc_info=True)  # fmt: skip

    def _call(self, job: Job) -> None:
        try:
            job()
        except Exception as err:
            self.stats.failed += 1
            self.stats.error = self.stats.error or f"{type(err).__name__}: {err}"
            log.exception("kvscope: a call's row could not be written")

    def _drain(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                if job is not _STOP:
                    self._call(job)
            finally:
                self._queue.task_done()

    def _before_fork(self) -> None:
        if os.getpid() == self._pid and self._thread.is_alive():
            self._paused = self._busy.acquire(timeout=CLOSE_TIMEOUT_S)

    def _after_fork(self) -> None:
        if self._paused:
            self._paused = False
            self._busy.release()


_LIVE: "weakref.WeakSet[Offload]" = weakref.WeakSet()


def _before_fork() -> None:
    for offload in list(_LIVE):
        offload._before_fork()


def _after_fork_in_parent() -> None:
    for offload in list(_LIVE):
        offload._after_fork()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)
