"""router.start waits for sglang-router to register every replica, not only for its /health.

sglang-router 0.3.2 answers /health at once and /readiness as soon as one worker is registered
(engines/sglang_router.py); a stand-in program with those routes checks that kvscope returns
only once GET /workers lists every replica healthy, and stops the router when that never comes.
"""

import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import free_port

from kvscope.config import RouterConfig
from kvscope.engines import router
from kvscope.engines.base import Launch
from kvscope.errors import EngineStartError

STANDIN = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, delay, urls = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
t0 = time.monotonic()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        up = urls if time.monotonic() - t0 > delay else urls[:1]
        body = {"/readiness": {"status": "ready"},
                "/workers": {"workers": [{"url": u, "is_healthy": True} for u in up]}}
        data = json.dumps(body.get(self.path, {})).encode()
        self.send_response(200 if self.path in body else 404)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""
URLS = ["http://127.0.0.1:8000", "http://127.0.0.1:8010"]


def standin(tmp_path: Path, delay_s: float, timeout_s: float) -> tuple[RouterConfig, Launch]:
    script = tmp_path / "standin_router.py"
    script.write_text(STANDIN)
    port = free_port(2)
    cfg = RouterConfig(
        kind="sglang-router", port=port, metrics_port=port + 1, startup_timeout_s=timeout_s
    )
    return cfg, Launch((sys.executable, str(script), str(port), str(delay_s), *URLS))


def test_start_waits_until_every_replica_is_registered(tmp_path: Path) -> None:
    cfg, command = standin(tmp_path, delay_s=2.0, timeout_s=30)
    t0 = time.monotonic()
    running = router.start(cfg, command, tmp_path / "router.log", URLS)
    try:
        assert time.monotonic() - t0 >= 2.0  # /readiness was 200 long before
        assert running.startup_s is not None and running.startup_s >= 2.0
        assert running.base_url == f"http://127.0.0.1:{cfg.port}"
    finally:
        running.stop()
    assert running.process is not None and not psutil.pid_exists(running.process.pid)


def test_a_replica_never_registered_fails_the_start_and_stops_the_router(tmp_path: Path) -> None:
    cfg, command = standin(tmp_path, delay_s=3600, timeout_s=2)
    started: list[int] = []
    real_start = router.ServerProcess.start

    def remember(self: router.ServerProcess) -> None:
        real_start(self)
        started.append(self.pid)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(router.ServerProcess, "start", remember)
        with pytest.raises(EngineStartError, match="did not register every replica"):
            router.start(cfg, command, tmp_path / "router.log", URLS)
    assert len(started) == 1 and not psutil.pid_exists(started[0])
