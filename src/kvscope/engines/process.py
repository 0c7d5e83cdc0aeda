"""An engine server as a child process: own process group, log file, health wait, clean stop."""

import atexit
import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import psutil

from kvscope.errors import EngineStartError, PortInUse

_live: set["ServerProcess"] = set()


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_range(span: int = 1, host: str = "127.0.0.1") -> int:
    """A port p such that p .. p+span-1 are free on `host` now, chosen BELOW the kernel's
    ephemeral range (ip_local_port_range). A port from that range, freed again, is what the
    next bind(0) of any process gets: an engine starting meanwhile takes it for one of its own
    sockets (vLLM's ZMQ sockets do), and the bind kvscope planned fails with "address in use"."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    lo = max(1024, low - 12000)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(lo, low - span)
        if all(port_free(host, p) for p in range(port, port + span)):
            return port
    raise PortInUse(f"no {span} free consecutive port(s) in [{lo}, {low}) on {host}")


def require_free_port(host: str, port: int, what: str) -> None:
    if not port_free(host, port):
        raise PortInUse(
            f"{what} port {port} on {host} is already in use; stop what holds it "
            f"(`kvscope engine down`, or `ss -ltnp 'sport = :{port}'`) or choose another port"
        )


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGTERM it if kvscope itself dies without cleaning up.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
    return members


def stop_group(pgid: int, extra_pids: Sequence[int] = (), grace_s: float = 20.0) -> None:
    """SIGTERM a process group (and any listed strays), then SIGKILL what is left."""
    procs = {p.pid: p for p in group_members(pgid)}
    for pid in extra_pids:
        with contextlib.suppress(psutil.Error):
            procs.setdefault(pid, psutil.Process(pid))
    if not procs:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    for proc in procs.values():
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


class ServerProcess:
    """A server started in a new session, so that one signal reaches its whole process tree."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        detached: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.detached = detached
        self._popen: subprocess.Popen[bytes] | None = None
        self._descendants: list[int] = []

    @property
    def pid(self) -> int:
        assert self._popen is not None, "not started"
        return self._popen.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        try:
            self._popen = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if self.detached else _die_with_parent,
            )
        except FileNotFoundError as err:
            raise EngineStartError(f"cannot execute {self.argv[0]}: {err.strerror}") from None
        finally:
            log.close()
        if not self.detached:
            _live.add(self)

    def exit_code(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def wait_healthy(self, url: str, timeout_s: float, what: str = "engine") -> float:
        """Poll `url` until it answers 200; returns seconds waited. Stops the process on failure."""
        start = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.exit_code()
                if code is not None:
                    self.stop()
                    raise EngineStartError(
                        f"{what} exited with code {code} before becoming healthy "
                        f"(full log: {self.log_path})",
                        tail(self.log_path),
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url).status_code == 200:
                        self._remember_descendants()
                        return time.monotonic() - start
                if time.monotonic() - start > timeout_s:
                    self.stop()
                    raise EngineStartError(
                        f"{what} not healthy at {url} after {timeout_s:.0f} s "
                        f"(full log: {self.log_path})",
                        tail(self.log_path),
                    )
                time.sleep(0.5)

    def _remember_descendants(self) -> None:
        with contextlib.suppress(psutil.Error):
            self._descendants = [p.pid for p in psutil.Process(self.pid).children(recursive=True)]

    def descendants(self) -> list[int]:
        return list(self._descendants)

    def stop(self, grace_s: float = 20.0) -> None:
        if self._popen is None:
            return
        stop_group(self._popen.pid, self._descendants, grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)
        _live.discard(self)


@atexit.register
def _stop_all() -> None:
    for proc in list(_live):
        proc.stop(grace_s=10.0)
