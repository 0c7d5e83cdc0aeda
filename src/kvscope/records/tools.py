"""The tool stream (tools.jsonl): one row per LangChain tool run an app made while profiled.

A tool run is a span of its workflow's trace; its time is also charged, as `tool_ms`, to the next
LLM call of the same top-level task (probe/runs.py).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.records.base import read_jsonl, record_dict

TOOLS_JSONL = "tools.jsonl"


@dataclass(frozen=True)
class ToolCall:
    """One tool run: its name, where it ran and when (ns since epoch)."""

    name: str
    workflow_run_id: str | None
    graph_node: str | None
    start_ns: int
    end_ns: int
    error: str | None  # the exception's type name if the tool raised

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


def load_tools(run_dir: Path) -> list[ToolCall]:
    """The run's tool runs, in the order they ended; empty when the run has none."""
    path = run_dir / TOOLS_JSONL
    rows = read_jsonl(path)[0] if path.exists() else []
    return [ToolCall(**row) for row in rows]
