"""Shared test helpers (tests/ is on sys.path via pytest's `pythonpath`)."""

import socket
from pathlib import Path

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
