"""Is the engine still serving? A watcher thread that notices, during a run, that it died.

    watch = EngineWatch(health_url, exit_code=handle.process.exit_code)
    watch.start()
    ...
    watch.gone()      # True once the engine died: stop sending (checks now: the process, then
                      # /health, confirmed `failures` times in a row, `confirm_s` apart)
    watch.death       # EngineDeath(at_ns, reason) or None
    watch.stop()      # before the engine is stopped on purpose: that is not a death

Contract: the engine is dead when the process kvscope started has exited (killed, OOM-killed,
crashed), or when its health endpoint failed `failures` times in a row (no answer, or a 5xx: an
engine whose worker died). The death's time is the first sign of it: the failed check that began
the run of failures, or the poll that found the process gone. A watch never revives an engine.
"""

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class EngineDeath:
    at_ns: int  # wall clock (ns since epoch) of the first sign
    reason: str  # "the engine process exited with status -9", "/health failed 3 times: ..."


class EngineWatch:
    def __init__(
        self,
        health_url: str,
        *,
        exit_code: Callable[[], int | None] | None = None,
        interval_s: float = 1.0,
        failures: int = 3,
        timeout_s: float = 5.0,
        confirm_s: float = 0.5,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.health_url, self.exit_code = health_url, exit_code
        self.interval_s, self.failures, self.timeout_s = interval_s, failures, timeout_s
        self.confirm_s = confirm_s
        self.headers = dict(headers or {})
        self.death: EngineDeath | None = None
        self._failed: list[tuple[int, str]] = []  # the current run of failed checks
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # one client for every check, under the lock: a new one per check (its SSL context
        # included) cost ~20 ms of CPU, taken from the profiled app's GIL once a second
        self._client: httpx.Client | None = None

    def start(self) -> "EngineWatch":
        self._thread = threading.Thread(target=self._loop, name="kvscope-engine-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def gone(self) -> bool:
        """Whether the engine is dead, checked now: a healthy engine costs one /health request;
        a failing one is checked again until it recovers or fails `failures` times in a row (an
        engine that has just died may stop listening before its process exits)."""
        if self._stop.is_set():
            return self.death is not None
        self.check()
        while self.death is None and self._failed and not self._stop.wait(self.confirm_s):
            self.check()
        return self.death is not None

    def check(self) -> EngineDeath | None:
        """One check now: the process, then the health endpoint."""
        with self._lock:
            if self.death is None:
                self._check_process()
            if self.death is None:
                self._check_health()
            return self.death

    def _loop(self) -> None:
        while self.death is None and not self._stop.wait(self.interval_s):
            self.check()

    def _check_process(self) -> None:
        code = self.exit_code() if self.exit_code is not None else None
        if code is not None:
            self.death = EngineDeath(
                time.time_ns(), f"the engine process exited with status {code}"
            )

    def _check_health(self) -> None:
        now = time.time_ns()
        try:
            if self._client is None:
                self._client = httpx.Client(timeout=self.timeout_s, headers=self.headers)
            reply = self._client.get(self.health_url)
            problem = f"HTTP {reply.status_code}" if reply.status_code >= 500 else None
        except httpx.HTTPError as err:
            problem = f"{type(err).__name__}: {err}".rstrip(": ")
        if problem is None:
            self._failed.clear()
            return
        self._failed.append((now, problem))
        if len(self._failed) >= self.failures and not self._stop.is_set():
            first = self._failed[0][0]
            reason = f"{self.health_url} failed {len(self._failed)} times in a row: {problem}"
            self.death = EngineDeath(first, reason)
