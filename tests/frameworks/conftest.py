"""Fixtures of the framework tests: the stand-in engine their drivers talk to."""

import subprocess
import sys
from collections.abc import Iterator

import pytest
from helpers import ROOT, free_port


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    """The stand-in engine (bench/standin_engine.py) on a free port: its /v1 base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "standin_engine.py"), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
