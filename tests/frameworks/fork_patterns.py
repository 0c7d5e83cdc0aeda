"""Many patterns of a framework driver from one interpreter, each in a process of its own.

A framework's import is most of a driver's time (CrewAI's ~4-5 s), so a driver imports the
framework once and `run_each` forks a child per pattern from that interpreter: each child starts
from the same freshly imported state (nothing one pattern does is seen by the next), runs in its
own folder (`OUT/<pattern>/`, its cwd; with `home`, HOME and XDG_DATA_HOME under it too), with
its own stdout and stderr there, and leaves `result.json` (what the pattern returned) and
`exit` (its exit code, or `timeout`). The parent never runs a pattern, so it starts no threads
before it forks.

The test side: `start_driver` runs a driver, `selected` says which patterns the session's tests
read, `read(out, pattern)` gives the pattern's result, or an AssertionError naming the pattern
with its stderr's tail (one pattern's failure fails only the tests that read it).
Standard library only: the driver imports it in the framework's virtualenv (copied next to it).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

POLL_S = 0.02


def run_each(
    patterns: Iterable[str],
    run: Callable[[str], Any],
    out: str,
    timeout_s: float,
    home: bool = True,
) -> None:
    """Run `run(pattern)` for each pattern in a forked child, one after another."""
    for pattern in patterns:
        folder = Path(out) / pattern
        folder.mkdir(parents=True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(folder, pattern, run, home)
        (folder / "exit").write_text(_wait(pid, timeout_s))


def _child(folder: Path, pattern: str, run: Callable[[str], Any], home: bool) -> None:
    code = 1
    try:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        if home:
            (folder / "home").mkdir()
            os.environ.update(HOME=str(folder / "home"), XDG_DATA_HOME=str(folder / "home/data"))
        os.chdir(folder)
        result = run(pattern)
        (folder / "result.json").write_text(json.dumps(result))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout_s: float) -> str:
    """The child's exit code as text, or `timeout` (then it is killed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return str(os.waitstatus_to_exitcode(status))
        time.sleep(POLL_S)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "timeout"


def read(out: Path, pattern: str, driver_stderr: str = "") -> tuple[Any, str]:
    """The pattern's result and its stdout; AssertionError naming the pattern where it did not
    finish cleanly (with its stderr, or the driver's where the driver never ran it)."""
    folder = out / pattern
    text = {n: (folder / n).read_text() if (folder / n).exists() else "" for n in
            ("exit", "stdout", "stderr")}  # fmt: skip
    if not text["exit"]:
        raise AssertionError(f"pattern {pattern!r} never ran; the driver:\n{driver_stderr[-3000:]}")
    assert text["exit"] == "0", (
        f"pattern {pattern!r}: exit {text['exit']}\n{text['stderr'][-3000:]}"
    )
    return json.loads((folder / "result.json").read_text()), text["stdout"]


def start_driver(
    python: Path, driver: str, folder: Path, patterns: list[str], env: dict[str, str],
    timeout_s: float,
) -> tuple[Path, str]:  # fmt: skip
    """The test side: run `driver` (its text: argv OUT PATTERN...) with the framework's `python`
    in `folder`, beside a copy of this module: the folder of the patterns' outputs and the
    driver's stderr. `env` gets PATTERN_TIMEOUT_S (`timeout_s`, per pattern)."""
    (folder / "driver.py").write_text(driver)
    shutil.copy(__file__, folder / "fork_patterns.py")
    out = folder / "out"
    done = subprocess.run(
        [str(python), str(folder / "driver.py"), str(out), *patterns], cwd=folder,
        env={**env, "PATTERN_TIMEOUT_S": str(timeout_s)}, capture_output=True, text=True,
        timeout=60 + timeout_s * len(patterns),
    )  # fmt: skip
    return out, done.stderr


def selected(request: Any, shared: dict[str, str]) -> list[str]:
    """The patterns of `shared` (pattern -> the test reading it) whose test is among the
    session's selected tests of the requesting module (`request`: a pytest FixtureRequest)."""
    module = request.module
    tests = {getattr(t, "originalname", "") for t in request.session.items if t.module is module}
    return [p for p, test in shared.items() if test in tests]
