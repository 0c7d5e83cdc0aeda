"""Prompt tokenization off the app's thread: one background thread, a bounded queue.

    worker = Tokenizing(capacity=4096)
    worker.submit(job)     # True: queued; False: the queue is full (the caller runs the job)
    worker.close()         # every queued job run, the thread ended (a profiled program's exit)

Making a prompt's token ids with the model's tokenizer is the one costly step of a call's row
(~0.25 ms for a 200-token prompt, ~1 ms for 1,000): done on the app's event loop, it stretches
every call of every workflow. A job is a callable (probe/instrument.py's: render the chat
template, encode, write the call's PromptColumns and token ids); the thread runs them in order.
Encoding releases the GIL (probe/tokens.ChatTokenizer.encode_text), so on a second core it runs
beside the app's thread instead of taking turns with it.

Contract: a job is run exactly once, by the thread, or by the caller when `submit` says False
(the queue is full: counted in `inline`, the first time logged as a warning), or by `close` when
the thread has died. A job that raises is logged and counted in `failed`; the others go on. After
`close`, `submit` says False. A fork (os.fork: multiprocessing) waits for the job in progress
(a child forked in the middle of one could inherit a lock held forever: pyarrow's, the
tokenizer's); the child starts with an empty queue and no thread, its first job starts its own.
"""

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)
Job = Callable[[], None]
_STOP = object()


@dataclass
class Counts:
    queued: int = 0  # run by the thread
    inline: int = 0  # the queue was full: run by the caller
    failed: int = 0  # raised (logged)


class Tokenizing:
    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.counts = Counts()
        self._closed = False
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        self._queue: queue.Queue[object] = queue.Queue(self.capacity)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._busy = threading.Lock()  # held while a job runs

    def _busy_acquire(self) -> None:
        self._busy.acquire()

    def _busy_release(self) -> None:
        self._busy.release()

    def submit(self, job: Job) -> bool:
        """Queue `job`; False when it was not queued (full, or closed): the caller runs it."""
        if self._closed:
            return False
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kvscope-tokenizing", daemon=True
                )
                self._thread.start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            if self.counts.inline == 0:
                log.warning(
                    "kvscope: the tokenizer fell behind the calls (%d queued); prompts are "
                    "tokenized on the app's thread meanwhile",
                    self.capacity,
                )
            self.counts.inline += 1
            return False
        return True

    def close(self) -> None:
        """Run what is queued and end the thread (idempotent)."""
        self._closed = True
        thread = self._thread
        if thread is None:
            return
        if thread.is_alive():
            self._queue.put(_STOP)
            thread.join()
        self._drain()  # a thread that died left its queue: run it here

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            with self._busy:
                self._do(job)  # type: ignore[arg-type]
            self.counts.queued += 1

    def _drain(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not _STOP:
                self._do(job)  # type: ignore[arg-type]
                self.counts.queued += 1

    def _do(self, job: Job) -> None:
        try:
            job()
        except Exception:
            self.counts.failed += 1
            log.exception("kvscope: a prompt could not be tokenized; its row keeps no ids")


_LIVE: "weakref.WeakSet[Tokenizing]" = weakref.WeakSet()


def _before_fork() -> None:
    for worker in list(_LIVE):
        worker._busy_acquire()


def _after_fork_in_parent() -> None:
    for worker in list(_LIVE):
        worker._busy_release()


def _after_fork_in_child() -> None:
    for worker in list(_LIVE):
        worker._reset()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
