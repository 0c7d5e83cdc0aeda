"""The invocation stream (invocations.jsonl): one row per graph invocation that raised.

A graph invocation (`graph.invoke(...)`, an `@entrypoint`'s, or the runnable the app invoked
around it) is a trace; its calls' rows say whether each call failed, not whether the invocation
itself did (a node or the entrypoint's own code raising after its calls succeeded). The probe's
RunTracker (probe/run_tracker.py) sees the root run end with an error and hands one of these to
the stream; the trace's root span then has status ERROR with it. Invocations that returned
normally have no row, nor do those in which no LLM call was made (they have no trace).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.records.plain import record_dict

INVOCATIONS_JSONL = "invocations.jsonl"
ERROR_TEXT_LIMIT = 2048  # characters of the exception's message kept


@dataclass(frozen=True)
class InvocationError:
    """An invocation that raised: its workflow_run_id (the rows' column), the exception's type
    name and message (cut at ERROR_TEXT_LIMIT), and when its root run ended (ns since epoch)."""

    workflow_run_id: str
    error_type: str
    error_message: str
    end_ns: int

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    @property
    def description(self) -> str:
        """The root span's status description: `ValueError: boom`."""
        return f"{self.error_type}: {self.error_message}" if self.error_message else self.error_type


def error_text(error: BaseException) -> str:
    text = str(error)
    return text if len(text) <= ERROR_TEXT_LIMIT else text[:ERROR_TEXT_LIMIT] + " ...[cut]"


def load_invocation_errors(run_dir: Path) -> dict[str, InvocationError]:
    """The run's failed invocations by workflow_run_id; empty when none failed (or the run
    predates the stream)."""
    path = run_dir / INVOCATIONS_JSONL
    from kvscope.records.base import read_jsonl  # orjson: not where a probe writes these

    rows = read_jsonl(path)[0] if path.exists() else []
    errors = [InvocationError(**row) for row in rows]
    return {e.workflow_run_id: e for e in errors}
