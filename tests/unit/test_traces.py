"""kvscope.traces: the run's MLflow traces written at publish from its streams, read back from a
real MLflow SQLite store."""

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from mlflow.entities import Span, SpanStatusCode, Trace
from mlflow.tracing.export.mlflow_v3 import MlflowV3SpanExporter

from kvscope.analysis.run import analyze_run
from kvscope.config import TrackingConfig
from kvscope.finalize import finalize
from kvscope.probe.tracing import QUEUE_SIZE_ENV, SPAN_BATCH_ENV, TraceAudit, TrackingRun
from kvscope.publish import WorkloadOutcome, publish
from kvscope.records.payloads import PAYLOADS_JSONL, CallPayload
from kvscope.records.requests import COLUMNS, to_table
from kvscope.records.tools import TOOLS_JSONL, ToolCall
from kvscope.traces import SPANS_IN_FLIGHT, Pace, TraceWrite, plan_traces, write_traces

MS = 1_000_000


def row(uuid: str, start_ms: int, **values: Any) -> dict[str, Any]:
    """A request row: every column None unless given, timed start_ms .. start_ms + 10."""
    out: dict[str, Any] = dict.fromkeys(COLUMNS)
    out |= {
        "benchmark_run_id": "bench",
        "experiment_name": "exp",
        "configuration_hash": "h",
        "timestamp": "2026-01-01T00:00:00Z",
        "workflow_type": "langgraph",
        "request_uuid": uuid,
        "model_name": "smollm2",
        "status": "ok",
        "start_ns": start_ms * MS,
        "end_ns": (start_ms + 10) * MS,
    }
    return out | values


def graph_row(uuid: str, start_ms: int, wf: str, agent: str, turn: int, **values: Any) -> dict:
    ids = {"thread_id": f"t-{wf}", "workflow_run_id": wf, "agent_id": agent, "turn_id": turn}
    return row(uuid, start_ms, graph_node=agent, **ids, **values)


MEASURED = {
    "prompt_tokens": 120,
    "output_tokens": 16,
    "cached_tokens": 80,
    "new_prefill_tokens": 40,
    "reported_cache_hit_ratio": 80 / 120,
    "ttft_ms": 12.5,
    "e2e_ms": 40.0,
    "cached_self_tokens": 48,
    "cached_cross_agent_tokens": 32,
    "cached_cross_workflow_tokens": 0,
    "uncached_cold_tokens": 40,
    "finish_reason": "stop",
}

FAILED = {
    "status": "error",
    "error_type": "HTTPStatusError",
    "error_message": "engine returned 500",
}
ROWS = [
    # wf-a: planner, executor (tool between its two calls), planner again (turn 2)
    graph_row("a1", 0, "wf-a", "planner", 1, **MEASURED),
    graph_row("a2", 20, "wf-a", "executor", 1, previous_agent_id="planner", **MEASURED),
    graph_row("a3", 50, "wf-a", "executor", 1, previous_agent_id="executor", tool_ms=5.0),
    graph_row("a4", 70, "wf-a", "planner", 2, previous_agent_id="executor", **FAILED),
    # wf-b: traced by the app itself (autolog)
    graph_row("b1", 5, "wf-b", "planner", 1, mlflow_trace_id="tr-app", **MEASURED),
    # outside any graph
    row("c1", 100, **MEASURED),
]
TOOLS = [
    ToolCall("lookup", "wf-a", "executor", 32 * MS, 45 * MS, None),
    ToolCall("broken", "wf-a", "executor", 46 * MS, 48 * MS, "ValueError"),
    ToolCall("elsewhere", "wf-b", "planner", 8 * MS, 9 * MS, None),
]
PAYLOADS = {"a1": CallPayload("a1", {"messages": [{"role": "user", "content": "plan"}]}, "ok")}


def test_plan_one_trace_per_invocation_and_per_graph_less_call() -> None:
    plans = plan_traces(ROWS, TOOLS, PAYLOADS)
    assert [p.root.name for p in plans] == ["langgraph", "llm"]  # wf-b is the app's
    wf = plans[0].root
    assert [(c.name, c.span_type) for c in wf.children] == [
        ("planner", "AGENT"),
        ("executor", "AGENT"),
        ("planner", "AGENT"),
    ]
    executor = wf.children[1]
    assert [c.name for c in executor.children] == ["llm", "lookup", "broken", "llm"]
    assert (wf.start_ns, wf.end_ns) == (0, 80 * MS)
    assert (executor.start_ns, executor.end_ns) == (20 * MS, 60 * MS)
    assert wf.span_count() == 10
    assert plans[0].metadata == {"mlflow.trace.session": "t-wf-a"}
    assert plans[0].tags["workflow.run_id"] == "wf-a"


@dataclass
class Written:
    run: TrackingRun
    write: TraceWrite
    audit: TraceAudit
    traces: dict[str, Trace]  # by root span name + workflow.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    env = pytest.MonkeyPatch()  # TrackingRun.open sets process-global MLflow state
    for name in (QUEUE_SIZE_ENV, SPAN_BATCH_ENV, "MLFLOW_TRACKING_URI"):
        env.delenv(name, raising=False)
    yield tmp_path_factory.mktemp("runs")
    env.undo()


def open_run(runs_dir: Path, name: str) -> TrackingRun:
    run = TrackingRun.open(TrackingConfig(experiment="kvscope-traces"), runs_dir)
    run.start(name, {}, {})
    return run


@pytest.fixture(scope="module")
def written(store: Path) -> Written:
    run_dir = store / "run"
    run_dir.mkdir()
    (run_dir / TOOLS_JSONL).write_text("".join(json.dumps(t.to_dict()) + "\n" for t in TOOLS))
    (run_dir / PAYLOADS_JSONL).write_text(
        "".join(json.dumps(p.to_dict()) + "\n" for p in PAYLOADS.values())
    )
    run = open_run(store, "synthetic")
    write = write_traces(
        run_dir, to_table(ROWS), client=run.client, experiment_id=run.experiment_id,
        run_id=run.run_id or "",
    )  # fmt: skip
    audit = run.finish(write.expected)
    found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
    traces = {}
    for t in found:
        (root,) = [s for s in t.data.spans if s.parent_id is None]
        traces[root.attributes.get("workflow.run_id") or root.name] = t
    return Written(run, write, audit, traces)


def spans(trace: Trace, span_type: str) -> list[Span]:
    found = [s for s in trace.data.spans if s.span_type == span_type]
    return sorted(found, key=lambda s: s.start_time_ns)


def test_written_traces_are_linked_to_the_run_and_audited(written: Written) -> None:
    assert sorted(written.traces) == ["llm", "wf-a"]
    # the app's trace id is not in the store: not linked, not expected
    assert written.write == TraceWrite(written=2, app_linked=0, app_elsewhere=1)
    assert (written.audit.expected, written.audit.written, written.audit.dropped) == (2, 2, 0)
    trace = written.traces["wf-a"]
    assert trace.info.trace_metadata["mlflow.sourceRun"] == written.run.run_id
    assert trace.info.trace_metadata["mlflow.trace.session"] == "t-wf-a"
    assert trace.info.tags["benchmark.run_id"] == "bench"
    assert trace.info.tags["workflow.run_id"] == "wf-a"
    assert len(trace.data.spans) == 10


def test_span_tree_times_and_status(written: Written) -> None:
    trace = written.traces["wf-a"]
    (root,) = [s for s in trace.data.spans if s.parent_id is None]
    assert (root.span_type, root.name) == ("WORKFLOW", "langgraph")
    assert (root.start_time_ns, root.end_time_ns) == (0, 80 * MS)
    assert root.status.status_code == SpanStatusCode.ERROR  # one call failed
    agents = spans(trace, "AGENT")
    assert [a.name for a in agents] == ["planner", "executor", "planner"]
    assert {a.parent_id for a in agents} == {root.span_id}
    assert agents[1].attributes["agent.previous_id"] == "planner"
    assert agents[1].attributes["gen_ai.agent.name"] == "executor"
    tools = spans(trace, "TOOL")
    assert [t.name for t in tools] == ["lookup", "broken"]
    assert {t.parent_id for t in tools} == {agents[1].span_id}
    assert tools[1].status.status_code == SpanStatusCode.ERROR
    llms = spans(trace, "LLM")
    assert [s.parent_id for s in llms] == [agents[0].span_id, *[agents[1].span_id] * 2,
                                           agents[2].span_id]  # fmt: skip
    failed = llms[-1]
    assert failed.status.status_code == SpanStatusCode.ERROR
    assert failed.status.description == "engine returned 500"
    assert failed.attributes["result.error_type"] == "HTTPStatusError"


def test_llm_span_attributes_design_note_gen_ai_and_kv(written: Written) -> None:
    first = spans(written.traces["wf-a"], "LLM")[0]
    a = first.attributes
    assert (a["agent.id"], a["agent.turn_id"], a["request.uuid"]) == ("planner", 1, "a1")
    assert (a["workflow.run_id"], a["workflow.id"], a["thread.id"]) == ("wf-a",) * 2 + ("t-wf-a",)
    assert (a["prompt.tokens"], a["prompt.cached_tokens"], a["prompt.new_prefill_tokens"]) == (
        120, 80, 40)  # fmt: skip
    assert (a["kv.prompt_tokens"], a["kv.cached_tokens"]) == (120, 80)
    assert a["kv.cache_hit_ratio"] == pytest.approx(80 / 120)
    assert (a["latency.ttft_ms"], a["latency.e2e_ms"], a["output.tokens"]) == (12.5, 40.0, 16)
    assert a["gen_ai.usage.input_tokens"] == 120
    assert a["gen_ai.usage.output_tokens"] == 16
    assert a["gen_ai.usage.cache_read.input_tokens"] == 80
    assert a["gen_ai.agent.name"] == "planner"
    assert a["gen_ai.conversation.id"] == "t-wf-a"
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert (a["kv.cached_self_tokens"], a["kv.cached_cross_agent_tokens"]) == (48, 32)
    assert a["kv.cached_cross_workflow_tokens"] == 0  # a measured 0 stays
    assert a["kv.uncached_cold_tokens"] == 40
    assert a["mlflow.chat.tokenUsage"] == {
        "input_tokens": 120, "output_tokens": 16, "total_tokens": 136,
        "cache_read_input_tokens": 80,
    }  # fmt: skip
    assert first.inputs == {"messages": [{"role": "user", "content": "plan"}]}
    assert first.outputs == "ok"


def test_nulls_are_left_off_never_zero(written: Written) -> None:
    third = spans(written.traces["wf-a"], "LLM")[2]  # a3: nothing measured but tool_ms
    a = third.attributes
    assert a["tool.ms"] == 5.0
    for name in ("prompt.tokens", "kv.cached_tokens", "gen_ai.usage.input_tokens",
                 "kv.cached_self_tokens", "latency.ttft_ms", "mlflow.chat.tokenUsage",
                 "kv.uncached_evicted_tokens", "gen_ai.response.finish_reasons"):  # fmt: skip
        assert name not in a, name
    assert third.inputs is None  # no payload recorded for it


def test_a_graph_less_call_is_a_trace_of_its_own(written: Written) -> None:
    trace = written.traces["llm"]
    (span,) = trace.data.spans
    assert (span.span_type, span.parent_id) == ("LLM", None)
    assert span.attributes["request.uuid"] == "c1"
    assert "agent.id" not in span.attributes and "workflow.run_id" not in span.attributes
    assert "mlflow.trace.session" not in trace.info.trace_metadata


def test_publish_writes_the_recorded_runs_traces(store: Path) -> None:
    name = "fixture-pressure-20261123-190437-ee5775"
    run_dir = store / name
    shutil.copytree(ROOT / "tests" / "fixtures" / "recorded-runs" / name, run_dir)
    finalize(run_dir)
    analysis = analyze_run(run_dir)
    run = open_run(store, "recorded")
    outcome = publish(analysis, run, WorkloadOutcome(), failure=KeyboardInterrupt())
    invocations = set(analysis.requests["workflow_run_id"].to_pylist())
    assert outcome.audit is not None
    assert outcome.audit.expected == outcome.audit.written == len(invocations) == 2
    found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
    llm = [s for t in found for s in t.data.spans if s.span_type == "LLM"]
    assert len(llm) == analysis.rows
    provenance = [s.attributes.get("kv.cached_self_tokens") for s in llm]
    expected = analysis.requests["cached_self_tokens"].to_pylist()
    assert sorted(provenance, key=str) == sorted(expected, key=str)
    assert any(v is not None for v in provenance)


def test_traces_written_back_to_back_are_all_kept(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fluent writer (kept for stores that take no bulk writes): many more spans than OTel's
    2,048-span export queue holds, ended faster than the exporter writes them (here slowed down,
    as on a busy machine): without pacing, a third of a load run's traces were lost on a 2-core
    machine (bench/load.py)."""
    export = MlflowV3SpanExporter.export

    def slow(self: MlflowV3SpanExporter, spans: Any) -> None:
        time.sleep(0.02)
        export(self, spans)

    monkeypatch.setattr(MlflowV3SpanExporter, "export", slow)
    rows = [
        graph_row(f"w{w}-{i}", w * 50 + i * 10, f"wf-{w}", agent, 1, **MEASURED)
        for w in range(400)
        for i, agent in enumerate(("planner", "executor", "expresser", "reviewer"))
    ]
    run_dir = store / "many"
    run_dir.mkdir()
    run = open_run(store, "many")
    write = write_traces(
        run_dir, to_table(rows), client=run.client, experiment_id=run.experiment_id,
        run_id=run.run_id or "", bulk=False,
    )  # fmt: skip
    audit = run.finish(write.expected)
    assert (audit.expected, audit.written, audit.dropped, audit.incomplete) == (400, 400, 0, 0)


def test_pace_drains_the_export_pipeline_every_limit_spans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drains: list[int] = []
    monkeypatch.setattr("mlflow.flush_trace_async_logging", lambda: drains.append(1))
    pace = Pace(limit=100)
    for _ in range(250):
        pace.ended()
    assert (len(drains), pace.pending) == (2, 50)
    assert Pace().limit == SPANS_IN_FLIGHT <= 2048 // 2
