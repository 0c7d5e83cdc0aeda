"""kvscope.probe.tracing against a real MLflow SQLite store (one store for the module)."""

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlflow
import pytest
from mlflow.entities import Span, SpanStatusCode, Trace
from mlflow.tracing.provider import _get_span_processor, _get_trace_exporter
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

from kvscope.config import TrackingConfig
from kvscope.probe.tracing import (
    PARAM_VALUE_LIMIT,
    QUEUE_SIZE_ENV,
    SIZE_STATS_KEY,
    SPAN_BATCH_ENV,
    SPAN_BATCH_SIZE,
    TOKEN_USAGE_KEY,
    TRACE_QUEUE_SIZE,
    TRUNCATED,
    TraceAudit,
    Tracer,
    TrackingRun,
    token_usage,
    trace_complete,
)
from kvscope.records.requests import STATUS_ERROR, STATUS_OK, RequestRecord, derived_cache
from kvscope.workload.runtime import CallIds

BENCH = "bench-1"
AGENTS = ("planner", "executor")
ERROR_THREAD = "thread-1"  # its executor call fails
UNCACHED_THREAD = "thread-2"  # its executor call reports no cached_tokens


def make_record(
    ids: CallIds,
    *,
    prompt_tokens: int | None = 120,
    cached_tokens: int | None = 80,
    status: str = STATUS_OK,
) -> RequestRecord:
    new_prefill, ratio = derived_cache(prompt_tokens, cached_tokens)
    failed = status != STATUS_OK
    return RequestRecord(
        benchmark_run_id=ids.benchmark_run_id,
        experiment_name="kvscope-test",
        configuration_hash="abc123",
        timestamp="2026-01-01T00:00:00Z",
        thread_id=ids.thread_id,
        workflow_run_id=ids.workflow_run_id,
        workflow_type="peer",
        workflow_concurrency=3,
        turn_id=ids.turn_id,
        agent_id=ids.agent_id,
        previous_agent_id=ids.previous_agent_id,
        graph_node=ids.graph_node,
        request_uuid=str(uuid.uuid4()),
        model_name="tiny",
        sglang_response_id=None if failed else "resp-1",
        prompt_tokens=prompt_tokens,
        output_tokens=None if failed else 16,
        cached_tokens=cached_tokens,
        new_prefill_tokens=new_prefill,
        reported_cache_hit_ratio=ratio,
        ttft_ms=None if failed else 12.5,
        tpot_ms=None if failed else 3.0,
        e2e_ms=40.0,
        tool_ms=7.0 if ids.agent_id == "executor" else None,
        prompt_template_version="v1",
        chat_template_name=None,
        prompt_hash="p-hash",
        prompt_layout="shared-first",
        sharing_mode=None,
        status=status,
        error_type="HTTPStatusError" if failed else None,
        error_message="engine returned 500" if failed else None,
        finish_reason=None if failed else "length",
        start_ns=1,
        end_ns=2,
    )


async def run_workflow(tracer: Tracer, thread_id: str) -> None:
    """One PEER-like workflow: planner (llm), executor (tool + llm); yields between spans."""
    workflow_run_id = f"wf-{thread_id}"
    with tracer.workflow(BENCH, thread_id, workflow_run_id, "peer"):
        previous = None
        for agent in AGENTS:
            ids = CallIds(BENCH, thread_id, workflow_run_id, 1, agent, previous, agent)
            with tracer.agent(ids):
                await asyncio.sleep(0)
                if agent == "executor":
                    with tracer.tool("calculator", {"expression": "6*7"}) as tool:
                        await asyncio.sleep(0)
                        tool.set_output("42")
                record = make_record(ids)
                if agent == "executor" and thread_id == ERROR_THREAD:
                    record = make_record(ids, cached_tokens=None, status=STATUS_ERROR)
                if agent == "executor" and thread_id == UNCACHED_THREAD:
                    record = make_record(ids, cached_tokens=None)
                messages = [{"role": "user", "content": f"{agent} of {thread_id}"}]
                with tracer.llm(ids, record.request_uuid, messages, "tiny") as span:
                    await asyncio.sleep(0)
                    content = None if record.status != STATUS_OK else f"{agent} says hi"
                    span.finish(record, content)
            previous = agent


async def run_workflows(tracer: Tracer, n: int) -> None:
    await asyncio.gather(*(run_workflow(tracer, f"thread-{i}") for i in range(n)))


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    env = pytest.MonkeyPatch()  # open() sets process-global MLflow state: undo it afterwards
    env.delenv(QUEUE_SIZE_ENV, raising=False)
    env.delenv(SPAN_BATCH_ENV, raising=False)
    env.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield tmp_path_factory.mktemp("runs")
    env.undo()


def open_run(runs_dir: Path) -> TrackingRun:
    return TrackingRun.open(TrackingConfig(experiment="kvscope-test"), runs_dir)


@dataclass
class Traced:
    run: TrackingRun
    audit: TraceAudit
    traces: dict[str, Trace]  # by session (thread_id)


@pytest.fixture(scope="module")
def traced(runs_dir: Path) -> Traced:
    run = open_run(runs_dir)
    params: dict[str, object] = {f"p{i}": i for i in range(120)}
    params["launch_command"] = "x" * 7000
    run.start("three-workflows", params, {"benchmark_run_id": BENCH})
    asyncio.run(run_workflows(Tracer(), 3))
    artifact = runs_dir / "summary.json"
    artifact.write_text("{}")
    run.log_artifact(artifact)
    run.log_dict({"rows": 3}, "audit/extra.json")
    audit = run.finish(expected_traces=3)
    found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
    traces = {t.info.trace_metadata["mlflow.trace.session"]: t for t in found}
    return Traced(run, audit, traces)


def spans_of(trace: Trace, span_type: str) -> list[Span]:
    return sorted(
        (s for s in trace.data.spans if s.span_type == span_type), key=lambda s: s.start_time_ns
    )


def llm_span(trace: Trace, agent: str) -> Span:
    (span,) = [s for s in spans_of(trace, "LLM") if s.attributes["agent.id"] == agent]
    return span


def test_one_trace_per_workflow_with_its_session_and_run(traced: Traced) -> None:
    assert sorted(traced.traces) == ["thread-0", "thread-1", "thread-2"]
    for thread_id, trace in traced.traces.items():
        assert trace.info.trace_metadata["mlflow.sourceRun"] == traced.run.run_id
        assert trace.info.tags["workflow.run_id"] == f"wf-{thread_id}"
        assert trace.info.tags["benchmark.run_id"] == BENCH
        # never merged: root + 2 agents + tool + 2 LLM calls, all of this workflow
        assert len(trace.data.spans) == 6
        owners = {s.attributes.get("workflow.run_id") for s in trace.data.spans}
        assert owners - {None} == {f"wf-{thread_id}"}


def test_span_tree_in_the_order_opened(traced: Traced) -> None:
    trace = traced.traces["thread-0"]
    (root,) = [s for s in trace.data.spans if s.parent_id is None]
    assert root.span_type == "WORKFLOW"
    agents = spans_of(trace, "AGENT")
    assert [s.name for s in agents] == list(AGENTS)
    assert {s.parent_id for s in agents} == {root.span_id}
    planner, executor = agents
    assert planner.attributes["agent.turn_id"] == 1
    assert "agent.previous_id" not in planner.attributes  # None is left off
    assert executor.attributes["agent.previous_id"] == "planner"
    assert executor.attributes["graph.node"] == "executor"
    assert executor.attributes["thread.id"] == "thread-0"
    (tool,) = spans_of(trace, "TOOL")
    assert tool.parent_id == executor.span_id
    assert (tool.name, tool.inputs, tool.outputs) == ("calculator", {"expression": "6*7"}, "42")
    llms = spans_of(trace, "LLM")
    assert [s.parent_id for s in llms] == [planner.span_id, executor.span_id]


def test_llm_span_carries_the_record(traced: Traced) -> None:
    span = llm_span(traced.traces["thread-0"], "executor")
    attrs = span.attributes
    assert attrs["workflow.run_id"] == "wf-thread-0"
    assert attrs["prompt.tokens"] == 120
    assert attrs["prompt.cached_tokens"] == 80
    assert attrs["prompt.new_prefill_tokens"] == 40
    assert attrs["prompt.reported_cache_hit_ratio"] == pytest.approx(80 / 120)
    assert attrs["output.tokens"] == 16
    assert (attrs["latency.ttft_ms"], attrs["latency.tpot_ms"]) == (12.5, 3.0)
    assert (attrs["latency.e2e_ms"], attrs["tool.ms"]) == (40.0, 7.0)
    assert (attrs["result.status"], attrs["result.finish_reason"]) == ("ok", "length")
    assert attrs["request.sglang_response_id"] == "resp-1"
    assert "result.error_type" not in attrs
    assert "tool.ms" not in llm_span(traced.traces["thread-0"], "planner").attributes
    assert attrs[TOKEN_USAGE_KEY] == {
        "input_tokens": 120,
        "output_tokens": 16,
        "total_tokens": 136,
        "cache_read_input_tokens": 80,
    }
    assert span.inputs["messages"] == [{"role": "user", "content": "executor of thread-0"}]
    assert span.outputs == "executor says hi"
    assert span.status.status_code == SpanStatusCode.OK
    # the span usage feeds MLflow's trace total (what the UI charts)
    total = json.loads(traced.traces["thread-0"].info.trace_metadata["mlflow.trace.tokenUsage"])
    assert total["cache_read_input_tokens"] == 160
    assert total["input_tokens"] == 240


def test_error_record_gives_an_error_span(traced: Traced) -> None:
    span = llm_span(traced.traces[ERROR_THREAD], "executor")
    assert span.status.status_code == SpanStatusCode.ERROR
    assert "engine returned 500" in span.status.description
    assert span.attributes["result.status"] == "error"
    assert span.attributes["result.error_type"] == "HTTPStatusError"
    assert "output.tokens" not in span.attributes
    assert span.attributes[TOKEN_USAGE_KEY] == {"input_tokens": 120}
    assert span.outputs is None
    ok = llm_span(traced.traces[ERROR_THREAD], "planner")
    assert ok.status.status_code == SpanStatusCode.OK


def test_unknown_cached_tokens_stay_unknown(traced: Traced) -> None:
    attrs = llm_span(traced.traces[UNCACHED_THREAD], "executor").attributes
    assert "cache_read_input_tokens" not in attrs[TOKEN_USAGE_KEY]
    assert attrs[TOKEN_USAGE_KEY]["input_tokens"] == 120
    for key in ("prompt.cached_tokens", "prompt.new_prefill_tokens"):
        assert key not in attrs


def test_audit_counts_all_traces_written(traced: Traced) -> None:
    assert traced.audit == TraceAudit(expected=3, written=3, dropped=0, incomplete=0)
    metrics = traced.run.client.get_run(traced.run.run_id or "").data.metrics
    assert (metrics["traces_expected"], metrics["traces_written"]) == (3, 3)
    assert metrics["traces_dropped"] == 0


def test_run_params_artifacts_and_store_layout(traced: Traced, runs_dir: Path) -> None:
    run = traced.run
    assert run.tracking_uri == f"sqlite:///{runs_dir.resolve()}/mlflow.db"
    data = run.client.get_run(run.run_id or "")
    assert data.info.status == "FINISHED"
    assert data.data.tags["benchmark_run_id"] == BENCH
    params = data.data.params
    assert len(params) == 121 and params["p119"] == "119"
    assert len(params["launch_command"]) == PARAM_VALUE_LIMIT
    assert params["launch_command"].endswith(TRUNCATED)
    experiment = run.client.get_experiment(run.experiment_id)
    assert experiment.artifact_location == (runs_dir / "mlartifacts").as_uri()
    artifacts = runs_dir / "mlartifacts" / (run.run_id or "") / "artifacts"
    assert (artifacts / "summary.json").read_text() == "{}"
    assert json.loads((artifacts / "audit" / "extra.json").read_text()) == {"rows": 3}
    assert data.info.artifact_uri == f"{experiment.artifact_location}/{run.run_id}/artifacts"


def test_export_pipeline_sized_before_tracing(traced: Traced) -> None:
    processor = _get_span_processor()  # built by the first span after TrackingRun.open
    assert processor.span_exporter._async_queue._queue.maxsize == TRACE_QUEUE_SIZE
    assert processor._batch_delegate._batch_processor._max_export_batch_size == SPAN_BATCH_SIZE


def test_param_limit_matches_mlflow() -> None:
    assert PARAM_VALUE_LIMIT == MAX_PARAM_VAL_LENGTH


def test_disabled_tracer_creates_no_trace(traced: Traced, runs_dir: Path) -> None:
    run = open_run(runs_dir)
    before = len(run.client.search_traces(locations=[run.experiment_id], max_results=1000))
    run.start("no-traces", {}, {})
    asyncio.run(run_workflows(Tracer(enabled=False), 2))
    assert run.finish(expected_traces=0) == TraceAudit(0, 0, 0, 0)
    after = len(run.client.search_traces(locations=[run.experiment_id], max_results=1000))
    assert after == before


def test_audit_reports_missing_traces(traced: Traced, runs_dir: Path) -> None:
    run = open_run(runs_dir)
    run.start("one-short", {}, {})
    asyncio.run(run_workflows(Tracer(), 1))
    assert run.finish(expected_traces=2, status="FAILED") == TraceAudit(2, 1, 1, 0)
    data = run.client.get_run(run.run_id or "")
    assert data.data.metrics["traces_dropped"] == 1
    assert data.info.status == "FAILED"


def test_real_queue_drops_are_counted(
    traced: Traced, runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(QUEUE_SIZE_ENV, "1")  # an exported value wins over kvscope's default
    run = open_run(runs_dir)
    run.start("tiny-queue", {}, {})
    asyncio.run(run_workflows(Tracer(), 20))  # 20 traces' export tasks arrive at once
    assert _get_trace_exporter()._async_queue._queue.maxsize == 1
    audit = run.finish(expected_traces=20)
    assert audit.dropped > 0
    assert audit.written + audit.dropped == 20
    found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
    assert sum(len(t.data.spans) == 6 for t in found) == audit.written
    mlflow.tracing.reset()  # the next tracer provider gets a normal queue again


def test_trace_missing_spans_is_incomplete() -> None:
    def fake(spans: int, num_spans: int | None) -> Any:
        stats = {} if num_spans is None else {SIZE_STATS_KEY: json.dumps({"num_spans": num_spans})}
        return SimpleNamespace(
            info=SimpleNamespace(trace_metadata=stats), data=SimpleNamespace(spans=[None] * spans)
        )

    assert trace_complete(fake(9, 9))
    assert not trace_complete(fake(2, 9))
    assert trace_complete(fake(3, None))
    assert not trace_complete(fake(0, None))


def test_token_usage_only_known_keys() -> None:
    ids = CallIds(BENCH, "t", "w", 1, "planner", None, "planner")
    assert token_usage(make_record(ids, prompt_tokens=None, cached_tokens=None)) == {
        "output_tokens": 16
    }


def test_ui_command(tmp_path: Path) -> None:
    argv, env = TrackingRun.ui_command(tmp_path, 5123)
    assert argv[1:4] == ["-m", "mlflow", "server"]
    opts = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert opts == {
        "--backend-store-uri": f"sqlite:///{tmp_path.resolve()}/mlflow.db",
        "--default-artifact-root": (tmp_path.resolve() / "mlartifacts").as_uri(),
        "--host": "127.0.0.1",
        "--port": "5123",
        "--workers": "1",
    }
    assert env == {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
