"""An agent framework in a virtualenv of its own, as users keep it (issue 33): the frameworks'
pins clash with kvscope's and with each other's, so a framework's tests run its apps with the
Python of that virtualenv, where kvscope is not installed.

`framework_python(name)` makes the virtualenv of `FRAMEWORKS[name]` once per machine (cached
under kvscope's cache directory by the hash of its requirements, reused by later sessions) with
the interpreter kvscope's own virtualenv was made from, and returns its `python`; a test is
skipped with the reason where the packages cannot be installed (no package index reachable).
`prefetch()` (tests/conftest.py, when a session collected a test that needs one) makes the
missing ones on a thread from the session's start, one after another, while the unit tests use
the other core: a test that needs a virtualenv still being made waits for it.
"""

import hashlib
import os
import subprocess
import sys
import threading
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS: dict[str, list[str]] = {
    "langgraph": [f"{d}=={version(d)}" for d in ("langgraph", "langchain-openai")],
    "openai-agents": [f"openai-agents=={version('openai-agents')}"],
    "crewai": ["crewai==1.15.30"],
    "autogen": ["autogen-agentchat==0.7.5", "autogen-ext[openai]==0.7.5"],
}
_LOCKS = {name: threading.Lock() for name in FRAMEWORKS}
_FAILED: dict[str, str] = {}  # name -> why its virtualenv could not be made


def _cache() -> Path:
    base = os.environ.get("KVSCOPE_TEST_VENVS") or os.path.expanduser("~/.cache/kvscope/test-venvs")
    return Path(base)


def _venv(name: str) -> Path:
    requirements = FRAMEWORKS[name]
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:12]
    return _cache() / f"{name}-{key}"


def framework_python(name: str) -> Path:
    """The `python` of `name`'s virtualenv, made now if no one made it (or is making it)."""
    _make(name)
    if name in _FAILED:
        pytest.skip(f"{name}'s virtualenv could not be installed: {_FAILED[name]}")
    return _venv(name) / "bin" / "python"


def prefetch(names: list[str] | None = None) -> threading.Thread:
    """Make the missing virtualenvs of `names` (all by default) on a thread, one at a time."""
    wanted = [n for n in names or list(FRAMEWORKS) if not (_venv(n) / ".complete").exists()]
    thread = threading.Thread(
        target=lambda: [_make(n) for n in wanted], name="framework-venvs", daemon=True
    )
    thread.start()
    return thread


def _make(name: str) -> None:
    with _LOCKS[name]:
        venv = _venv(name)
        if (venv / ".complete").exists() or name in _FAILED:
            return
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", *FRAMEWORKS[name]],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            _FAILED[name] = done.stderr[-500:]
            return
        (venv / ".complete").write_text("\n".join(FRAMEWORKS[name]))
