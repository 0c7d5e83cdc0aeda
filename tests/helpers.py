"""Shared test helpers (tests/ is on sys.path via pytest's `pythonpath`)."""

import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VLLM_FIXTURES = ROOT / "tests" / "fixtures" / "vllm-0.32.0"


def free_port(span: int = 1) -> int:
    """A port p such that p .. p+span-1 are free on loopback right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + span >= 65535:
            continue
        ok = True
        for p in range(port, port + span):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no free port range")


# --- the integration session's engine (tests/integration/conftest.py) ---
KVSCOPE = [sys.executable, "-m", "kvscope.cli"]
CAPACITY = 8192


@dataclass
class Up:
    env: dict[str, str]
    state: dict[str, Any]
    state_dir: Path

    @property
    def engine_config(self) -> dict[str, Any]:
        """The running engine's config: an experiment with this engine section reuses it."""
        return dict(self.state["config"])

    @property
    def base(self) -> str:
        return self.state["endpoints"]["base_url"]

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*KVSCOPE, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
