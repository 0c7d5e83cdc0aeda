"""A graph invocation that raised, end to end in a capture's streams: the probe writes it to
invocations.jsonl, and its trace's root has status ERROR with the exception (issue 33)."""

from pathlib import Path

import pytest
from test_identity import BASE, Engine
from test_invocation_errors import two_nodes

from kvscope.config import EngineConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.intercept import Interceptor
from kvscope.probe.streams import CallStreams
from kvscope.probe.wire import RunInfo
from kvscope.records.invocations import load_invocation_errors
from kvscope.records.requests import read_rows
from kvscope.traces import plan_traces

INFO = RunInfo("run", "exp", "h", "langgraph", None, "smollm2", None)


def test_a_raised_invocations_trace_root_is_error(tmp_path: Path) -> None:
    streams = CallStreams(tmp_path, tokens=False, payloads=False)
    ctx = streams.context(INFO, None, store_prompts=False)
    with Interceptor(VllmEngine(EngineConfig()), BASE, ctx, on_tool=streams.tool,
                     on_error=streams.invocation_error):  # fmt: skip
        two_nodes(Engine(), fail=False).invoke({"n": 0})
        with pytest.raises(ValueError):
            two_nodes(Engine(), fail=True).invoke({"n": 0})
    streams.close()

    rows = read_rows(tmp_path)[0]
    raised = load_invocation_errors(tmp_path)
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    (failed_run,) = raised
    plans = {p.tags["workflow.run_id"]: p for p in plan_traces(rows, [], {}, raised)}
    assert len(plans) == 2
    root = plans[failed_run].root
    assert root.error == "ValueError: the writer broke"
    assert root.end_ns >= raised[failed_run].end_ns
    (ok_run,) = set(plans) - {failed_run}
    assert plans[ok_run].root.error is None
    # without the stream (a run before it), the same invocation's root says nothing
    assert {p.root.error for p in plan_traces(rows, [], {})} == {None}
