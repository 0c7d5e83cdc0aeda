"""Engine process management, with small stand-in server processes (no engine needed)."""

import sys
import time
from pathlib import Path
from typing import ClassVar

import psutil
import pytest
from helpers import free_port

from kvscope.config import EngineConfig
from kvscope.engines.base import Endpoints, Engine, Launch
from kvscope.engines.process import ServerProcess, group_members, stop_group
from kvscope.engines.runtime import running, start
from kvscope.errors import EngineStartError

# Spawns a grandchild (like vLLM's engine core), records its pid, then serves /health.
SERVER = """
import runpy, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[2], "w").write(str(child.pid))
sys.argv = ["http.server", sys.argv[1], "--bind", "127.0.0.1", "--directory", sys.argv[3]]
runpy.run_module("http.server", run_name="__main__")
"""


class StandIn(Engine):
    name: ClassVar[str] = "stand-in"

    def __init__(self, config: EngineConfig, argv: list[str]) -> None:
        super().__init__(config)
        self.argv = argv

    def endpoints(self) -> Endpoints:
        return Endpoints(self.base_url, None, None)

    def launch(self) -> Launch:
        return Launch(tuple(self.argv))


def serving(tmp_path: Path) -> tuple[list[str], int, Path]:
    docroot = tmp_path / "www"
    docroot.mkdir()
    (docroot / "health").write_text("ok")
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    port = free_port()
    pidfile = tmp_path / "grandchild.pid"
    return [sys.executable, str(script), str(port), str(pidfile), str(docroot)], port, pidfile


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_healthy_then_stopped_with_its_whole_tree(tmp_path: Path) -> None:
    argv, port, pidfile = serving(tmp_path)
    proc = ServerProcess(argv, {}, tmp_path / "log")
    proc.start()
    waited = proc.wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=30)
    assert waited < 30
    grandchild = int(pidfile.read_text())
    assert psutil.pid_exists(grandchild)
    proc.stop(grace_s=5)
    assert gone(proc.pid)
    assert gone(grandchild)
    assert group_members(proc.pid) == []


def test_exit_before_healthy_reports_code_and_log_tail(tmp_path: Path) -> None:
    code = "import sys; print('loading weights'); print('boom: bad weights'); sys.exit(3)"
    proc = ServerProcess([sys.executable, "-c", code], {}, tmp_path / "log")
    proc.start()
    with pytest.raises(EngineStartError) as err:
        proc.wait_healthy(f"http://127.0.0.1:{free_port()}/health", timeout_s=30)
    text = str(err.value)
    assert "exited with code 3" in text
    assert "boom: bad weights" in text
    assert "boom: bad weights" in err.value.log_tail


def test_health_timeout_stops_the_process_and_shows_the_log(tmp_path: Path) -> None:
    code = "import time; print('still loading', flush=True); time.sleep(120)"
    proc = ServerProcess([sys.executable, "-c", code], {}, tmp_path / "log")
    proc.start()
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as err:
        proc.wait_healthy(f"http://127.0.0.1:{free_port()}/health", timeout_s=1.5)
    assert time.monotonic() - t0 < 20
    assert "not healthy" in str(err.value) and "after 2 s" in str(err.value)
    assert "still loading" in err.value.log_tail
    assert gone(proc.pid)


def test_missing_executable_is_one_clear_error(tmp_path: Path) -> None:
    proc = ServerProcess([str(tmp_path / "no-such-python")], {}, tmp_path / "log")
    with pytest.raises(EngineStartError, match="cannot execute"):
        proc.start()


def test_stop_escalates_to_kill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(120)"
    )
    proc = ServerProcess([sys.executable, "-c", code], {}, tmp_path / "log")
    proc.start()
    deadline = time.monotonic() + 20
    while "ready" not in (tmp_path / "log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    stop_group(proc.pid, grace_s=1.0)
    assert time.monotonic() - t0 < 10
    assert gone(proc.pid)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_running_stops_the_engine_on_errors_and_ctrl_c(tmp_path: Path, exc: type) -> None:
    argv, port, pidfile = serving(tmp_path)
    engine = StandIn(EngineConfig(port=port, startup_timeout_s=30), argv)
    pids: list[int] = []
    with pytest.raises(exc), running(engine, tmp_path / "log") as handle:
        assert handle.process is not None
        pids += [handle.process.pid, int(pidfile.read_text())]
        raise exc()
    assert pids and all(gone(p) for p in pids)


def test_detached_start_survives_until_stopped(tmp_path: Path) -> None:
    argv, port, _ = serving(tmp_path)
    engine = StandIn(EngineConfig(port=port, startup_timeout_s=30), argv)
    handle = start(engine, tmp_path / "log", detached=True)
    assert handle.process is not None and handle.startup_s is not None
    pid = handle.process.pid
    assert psutil.pid_exists(pid)
    stop_group(pid, handle.process.descendants(), grace_s=5)
    assert gone(pid)
