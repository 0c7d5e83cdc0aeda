"""A tool run's input and output: cut at the limit, kept only where the run keeps payloads."""

import json
from pathlib import Path

from kvscope.probe.streams import CallStreams
from kvscope.records.tools import CUT, TOOL_TEXT_LIMIT, ToolCall, load_tools, tool_text
from kvscope.traces import _tool


class Message:
    content = "from a ToolMessage"


def test_tool_text() -> None:
    assert tool_text(None) is None
    assert tool_text({"q": 1}) == "{'q': 1}"
    assert tool_text(Message()) == "from a ToolMessage"
    long = tool_text("x" * (TOOL_TEXT_LIMIT + 5))
    assert long is not None and long == "x" * TOOL_TEXT_LIMIT + CUT


def call() -> ToolCall:
    return ToolCall("lookup", "w", "agent/tools", 1, 2, None, "{'q': 'x'}", "found")


def test_kept_with_payloads_dropped_without(tmp_path: Path) -> None:
    for payloads, folder in ((True, tmp_path / "on"), (False, tmp_path / "off")):
        folder.mkdir()
        streams = CallStreams(folder, tokens=False, payloads=payloads)
        streams.tool(call())
        streams.close()
        (kept,) = load_tools(folder)
        assert (kept.input, kept.output) == (("{'q': 'x'}", "found") if payloads else (None, None))
    old = {"name": "t", "workflow_run_id": None, "graph_node": None, "start_ns": 1,
           "end_ns": 2, "error": None}  # fmt: skip
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "tools.jsonl").write_text(json.dumps(old) + "\n")
    assert load_tools(tmp_path / "old")[0].input is None  # an older run's stream still loads


def test_the_trace_span_carries_them() -> None:
    span = _tool(call())
    assert span.inputs == {"input": "{'q': 'x'}"} and span.outputs == "found"
    assert _tool(call().without_text()).inputs is None
