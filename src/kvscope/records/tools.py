"""The tool stream (tools.jsonl): one row per LangChain tool run an app made while profiled.

A tool run is a span of its workflow's trace; its time is also charged, as `tool_ms`, to the next
LLM call of the same top-level task (probe/run_tracker.py).
"""

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvscope.records.plain import record_dict

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
    # What it was given and returned, as text cut at TOOL_TEXT_LIMIT characters; kept only where
    # the run keeps call payloads (tracking.traces), like the LLM calls' bodies. None: not kept.
    input: str | None = None
    output: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    def without_text(self) -> "ToolCall":
        """The same run without its input and output (a run that keeps no payloads)."""
        return replace(self, input=None, output=None)


TOOL_TEXT_LIMIT = 8192
CUT = " ...[cut]"


def tool_text(value: Any) -> str | None:
    """A tool's input or output as kept: a message's content, else str(); cut at the limit."""
    if value is None:
        return None
    content = getattr(value, "content", value)
    text = content if isinstance(content, str) else str(content)
    return text if len(text) <= TOOL_TEXT_LIMIT else text[:TOOL_TEXT_LIMIT] + CUT


def load_tools(run_dir: Path) -> list[ToolCall]:
    """The run's tool runs, in the order they ended; empty when the run has none."""
    path = run_dir / TOOLS_JSONL
    from kvscope.records.base import read_jsonl  # orjson: not where a probe writes these

    rows = read_jsonl(path)[0] if path.exists() else []
    return [ToolCall(**row) for row in rows]
