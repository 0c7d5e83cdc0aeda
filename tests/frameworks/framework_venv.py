"""An agent framework in a virtualenv of its own, as users keep it (issue 33): the frameworks'
pins clash with kvscope's and with each other's, so a framework's tests run its apps with the
Python of that virtualenv, where kvscope is not installed.

`framework_python(name, requirements)` makes the virtualenv once per machine (cached under
kvscope's cache directory by the hash of its requirements, reused by later sessions) with the
interpreter kvscope's own virtualenv was made from, and returns its `python`; a test is skipped
with the reason where the packages cannot be installed (no package index reachable).
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cache() -> Path:
    base = os.environ.get("KVSCOPE_TEST_VENVS") or os.path.expanduser("~/.cache/kvscope/test-venvs")
    return Path(base)


def framework_python(name: str, requirements: list[str]) -> Path:
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:12]
    venv = _cache() / f"{name}-{key}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         *requirements],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"{name}'s virtualenv could not be installed: {done.stderr[-500:]}")
    (venv / ".complete").write_text("\n".join(requirements))
    return python
