"""The lite probe: kvscope's probe in a program whose interpreter does not have kvscope installed
(`kvscope profile -- /path/to/app-venv/bin/python app.py`: the app keeps its own virtualenv,
with its own pins).

The boot `sitecustomize` (probe/boot/) loads it instead of probe/child.py when `kvscope` is not
importable in the program's interpreter (or kvscope's own dependencies are not): it then adds
`KVSCOPE_PROBE_PATH` (a folder holding only a link to kvscope's package, made by the profiling
process: probe/child.py) at the END of sys.path, so the app's own packages always win, and
imports from kvscope only modules that need nothing beyond the standard library and what the app
imports itself: the interception (probe/intercept.py, on the app's httpx / httpx2), the identity
readers (probe/identity.py: LangGraph's context where the app has langchain-core, the OpenAI
Agents SDK's where it has `agents`), and the call record (probe/raw_call.py).

Each process writes part files of its own pid into the run directory, one JSON line per record,
flushed as written: `raw_calls.jsonl.<pid>` (the calls, tagged and recorded as the app read them,
made rows by the profiling process when the session closes: probe/raw_rows.py), `tools.jsonl.<pid>`
and `invocations.jsonl.<pid>` (the same records as kvscope's own probe writes), and the marker
`probe.<pid>.json` (`"probe": "lite"`). It sends the run's eviction hints (probe/hints.py) and
asks the engine for the prompt's exact ids (the engine's own ids module) as kvscope's own probe
does.
"""

import atexit
import json
import os
import sys
import threading
from pathlib import Path
from typing import IO, Any

from kvscope.probe.hints import make_hints
from kvscope.probe.identity import CallIdentity
from kvscope.probe.intercept import Interceptor
from kvscope.probe.raw_call import RAW_CALLS_JSONL, RawCall, WireTemplate
from kvscope.records.invocations import INVOCATIONS_JSONL, InvocationError
from kvscope.records.tools import TOOLS_JSONL, ToolCall

PATH_ENV = "KVSCOPE_PROBE_PATH"


class _Parts:
    """This process's part files (one lock: calls end in many threads)."""

    def __init__(self, run_dir: Path, payloads: bool) -> None:
        self.run_dir, self.payloads = run_dir, payloads
        self.lock = threading.Lock()
        self.files: dict[str, IO[str]] = {}
        self.reopen()

    def reopen(self) -> None:
        """This pid's files from now on (also in a forked child), and its marker."""
        self.files = {}
        self.part = mark(self.run_dir, "lite")

    def _write(self, stream: str, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self.lock:
            f = self.files.get(stream)
            if f is None:
                f = self.files[stream] = open(  # noqa: SIM115 - open until the process exits
                    self.run_dir / (stream + self.part), "a", encoding="utf-8"
                )
            f.write(line)
            f.flush()

    def call(self, record: dict[str, Any]) -> None:
        self._write(RAW_CALLS_JSONL, record)

    def tool(self, call: ToolCall) -> None:
        self._write(TOOLS_JSONL, (call if self.payloads else call.without_text()).to_dict())

    def invocation_error(self, error: InvocationError) -> None:
        self._write(INVOCATIONS_JSONL, error.to_dict())

    def close(self) -> None:
        with self.lock:
            for f in self.files.values():
                f.close()
            self.files = {}


def mark(run_dir: Path, probe: str | None = None) -> str:
    """Leave this process's marker `probe.<pid>.json` (its argv and interpreter; `probe`: "lite"
    for this probe, absent for kvscope's own); its part-file suffix `.<pid>`."""
    pid = os.getpid()
    marker = {"pid": pid, "argv": sys.argv, "python": sys.executable}
    (run_dir / f"probe.{pid}.json").write_text(
        json.dumps(marker | ({"probe": probe} if probe else {}))
    )
    return f".{pid}"


_ATTACHED: list[_Parts] = []


def attach(spec_path: str) -> None:
    """Capture this process's calls into the session `spec_path` (capture.json) describes
    (idempotent)."""
    if _ATTACHED:
        return
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("wire") is None:
        raise RuntimeError("the capture spec has no wire template (an older kvscope made it)")
    template = WireTemplate(**spec["wire"])
    parts = _Parts(Path(spec["run_dir"]), bool(spec.get("traces")))
    hints = make_hints(spec.get("eviction_hints"))

    def make_call(body: dict[str, Any], ident: CallIdentity, responses: bool) -> RawCall:
        return RawCall(template, body, ident, responses, parts.call, hints)

    Interceptor(None, spec["base_url"], None, on_tool=parts.tool,
                on_error=parts.invocation_error, make_call=make_call).__enter__()  # fmt: skip
    os.register_at_fork(after_in_child=parts.reopen)
    atexit.register(parts.close)
    _ATTACHED.append(parts)
