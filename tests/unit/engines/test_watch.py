"""An engine that dies during a run: the watch notices (its process gone at once, or its health
endpoint failing in a row), the driver stops starting workflows, and the run's status says when,
after how many calls and what was not run."""

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import free_port
from peer_engine import BASE, ScriptedEngine

from kvscope.config import WorkloadConfig
from kvscope.engines.watch import EngineWatch
from kvscope.records.status import RunStatus
from kvscope.workload.driver import run_workflows


class Health:
    """A /health endpoint whose answer the test sets (200, 500, or no server at all)."""

    def __init__(self) -> None:
        self.code, self.hits = 200, 0
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                health.hits += 1
                self.send_response(health.code)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/health"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def health() -> Iterator[Health]:
    h = Health()
    yield h
    h.server.shutdown()


def test_a_process_that_exited_is_dead_at_once(health: Health) -> None:
    code: list[int | None] = [None]
    watch = EngineWatch(health.url, exit_code=lambda: code[0], interval_s=60)
    assert not watch.gone()
    code[0] = -9
    before = time.time_ns()
    assert watch.gone() and watch.death is not None
    assert watch.death.at_ns >= before and "status -9" in watch.death.reason


def test_health_must_fail_in_a_row_and_the_death_dates_from_the_first_failure(
    health: Health,
) -> None:
    watch = EngineWatch(health.url, failures=3, timeout_s=2)
    health.code = 500
    first = time.time_ns()
    watch.check()
    watch.check()
    health.code = 200  # it recovered: the run of failures starts again
    assert watch.check() is None
    health.code = 503
    again = time.time_ns()
    for _ in range(2):
        assert watch.check() is None
    death = watch.check()
    assert death is not None and death.at_ns >= again > first and "HTTP 503" in death.reason


def test_the_watch_thread_finds_a_server_that_went_away(health: Health) -> None:
    watch = EngineWatch(health.url, interval_s=0.05, failures=2, timeout_s=1).start()
    time.sleep(0.2)
    assert watch.death is None and health.hits >= 2
    health.server.shutdown()
    health.server.server_close()
    deadline = time.monotonic() + 10
    while watch.death is None and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert watch.death is not None and "failed 2 times" in watch.death.reason


def test_a_stopped_watch_reports_no_death() -> None:
    watch = EngineWatch("http://127.0.0.1:9/health", exit_code=lambda: 0, failures=1)
    watch.stop()  # the engine is being stopped on purpose
    assert not watch.gone() and watch.death is None


def test_the_driver_starts_no_workflow_once_told_to_stop() -> None:
    engine = ScriptedEngine()
    done: list[str] = []
    cfg = WorkloadConfig(workflows=5, concurrency=1, cycles=1, loop="fixed")
    results = asyncio.run(
        run_workflows(
            BASE, "smollm2", cfg, client=engine.client(),
            on_workflow_done=lambda r: done.append(r.thread_id),
            should_stop=lambda: len(done) >= 2,
        )
    )  # fmt: skip
    assert len(results) == 2 and len(engine.by_thread()) == 2


def rows(*specs: tuple[str, int]) -> list[dict]:
    return [{"status": s, "end_ns": end} for s, end in specs]


def test_status_of_a_run_whose_engine_died() -> None:
    table = rows(("ok", 10), ("ok", 20), ("error", 40), ("error", 41))
    s = RunStatus.of(table, death=(30, "the engine process exited with status -9"),
                     planned=4, ran=2)  # fmt: skip
    assert (s.state, s.calls, s.failed_calls) == ("engine_died", 4, 2)
    assert (s.calls_before_engine_death, s.workflows_planned, s.workflows_not_run) == (2, 4, 2)
    assert s.engine_died_at == "1970-01-01T00:00:00+00:00"
    assert "after 2 successful call(s); 2 workflow(s) not run" in (s.reason or "")
    assert not s.complete


def test_status_of_other_endings() -> None:
    ok = rows(("ok", 1), ("timeout", 2))
    assert RunStatus.of(ok, planned=1, ran=1).state == "complete"
    assert RunStatus.of(ok).workflows_not_run is None  # an app's workflows: not known
    assert RunStatus.of(ok, failure=KeyboardInterrupt()).state == "interrupted"
    failed = RunStatus.of(ok, failure=RuntimeError("boom"))
    assert (failed.state, failed.reason) == ("failed", "RuntimeError: boom")
    assert RunStatus.of([], planned=3, ran=1).state == "failed"


def test_gone_confirms_a_failing_engine_before_it_answers(health: Health) -> None:
    """An engine that has just died may stop listening before its process exits: `gone()`
    checks again until the failures in a row make a death (or the engine recovers)."""
    watch = EngineWatch(health.url, failures=3, confirm_s=0.05, timeout_s=1)
    assert not watch.gone() and health.hits == 1  # healthy: one request
    health.code = 500
    assert watch.gone() and health.hits == 4 and watch.death is not None
