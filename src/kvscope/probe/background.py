"""A capture's work after a call's row is built, off the app's thread: one background thread, a
bounded queue.

    worker = Background(capacity=4096)
    worker.submit(job)     # True: queued; False: the queue is full (the caller runs the job)
    worker.close()         # every queued job run, the thread ended (a profiled program's exit)

What a call leaves behind once its row is built (writing the row, its payload and its prompt
token ids to their streams; making the prompt's ids with the model's tokenizer, or handing them
to the tokenizer process) is a job here, so that the app's event loop pays for building the row
and a queue append, not for file writes and encoding (issue 32: a flush per row on the loop made
the loop wait for the GIL behind the other threads at every write).

The hand-off is a `collections.deque` append: no lock, no wake-up of the thread (a wake-up per
call is a futex call and a GIL hand-over on the app's thread). The thread wakes every `poll_s`
(20 ms), runs every job queued meanwhile in order, and sleeps again; half a full queue wakes it
at once. So a row reaches its file at most ~20 ms after its call ended, and a process killed
outright (SIGKILL) loses what was queued then; an exit, an exception or a signal the program
handles ends the capture's `close`, which runs the rest.

Contract: a job is run exactly once, by the thread, or by the caller when `submit` says False
(the queue is full: counted in `inline`, the first time logged as a warning), or by `close` when
the thread has died. A job that raises is logged and counted in `failed`; the others go on. After
`close`, `submit` says False. A fork (os.fork: multiprocessing) waits for the job in progress
(a child forked in the middle of one could inherit a lock held forever: pyarrow's, the
tokenizer's); the child starts with an empty queue and no thread, its first job starts its own.
"""

import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)
Job = Callable[[], None]
THREAD_NAME = "kvscope-background"


@dataclass
class Counts:
    queued: int = 0  # run by the thread
    inline: int = 0  # the queue was full: run by the caller
    failed: int = 0  # raised (logged)


class Background:
    def __init__(self, capacity: int = 4096, poll_s: float = 0.02) -> None:
        self.capacity, self.poll_s = capacity, poll_s
        self.counts = Counts()
        self._closed = False
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        self._jobs: deque[Job] = deque()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = False
        self._lock = threading.Lock()
        self._busy = threading.Lock()  # held while a job runs

    def on_thread(self) -> bool:
        """Whether the caller is this worker's thread (a job that makes more work runs it)."""
        return self._thread is threading.current_thread()

    def submit(self, job: Job) -> bool:
        """Queue `job`; False when it was not queued (full, or closed): the caller runs it."""
        if self._closed:
            return False
        if self._thread is None:
            self._start()
        jobs = self._jobs
        if len(jobs) >= self.capacity:
            if self.counts.inline == 0:
                log.warning(
                    "kvscope: the background writer fell behind the calls (%d queued); rows "
                    "are written and prompts tokenized on the app's thread meanwhile",
                    self.capacity,
                )
            self.counts.inline += 1
            return False
        jobs.append(job)
        if len(jobs) == self.capacity // 2:
            self._wake.set()
        if self._closed:  # closed while this was queued: `close` may have drained already
            self._drain()
        return True

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread = thread
                thread.start()

    def close(self) -> None:
        """Run what is queued and end the thread (idempotent)."""
        self._closed = True
        thread = self._thread
        if thread is None:
            return
        if thread.is_alive() and thread is not threading.current_thread():
            self._stop = True
            self._wake.set()
            thread.join()
        self._drain()  # a thread that died left its queue: run it here

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            while jobs:
                job = jobs.popleft()
                with self._busy:
                    self._do(job)
                self.counts.queued += 1
            if self._stop:
                return
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def _drain(self) -> None:
        jobs = self._jobs
        while True:
            try:
                job = jobs.popleft()
            except IndexError:
                return
            self._do(job)
            self.counts.queued += 1

    def _do(self, job: Job) -> None:
        try:
            job()
        except Exception:
            self.counts.failed += 1
            log.exception("kvscope: a call's row, payload or prompt ids could not be written")


_LIVE: "weakref.WeakSet[Background]" = weakref.WeakSet()


def _before_fork() -> None:
    for worker in list(_LIVE):
        worker._busy.acquire()


def _after_fork_in_parent() -> None:
    for worker in list(_LIVE):
        worker._busy.release()


def _after_fork_in_child() -> None:
    for worker in list(_LIVE):
        worker._reset()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
