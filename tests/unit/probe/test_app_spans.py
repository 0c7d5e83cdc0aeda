"""probe/app_spans.annotate on the app's own trace: a LangGraph graph traced by
`mlflow.langchain.autolog()`, its ChatOpenAI calls to the stand-in vLLM through kvscope's
Interceptor; kvscope's measurements land on autolog's spans, and no second trace is written."""

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pytest
from test_identity import Engine, Loop, llm, planner_executor_loop

from kvscope.config import EngineConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.probe import app_spans
from kvscope.probe.intercept import Interceptor
from kvscope.probe.wire import CallContext
from kvscope.records.requests import RequestRecord
from kvscope.traces import plan_traces

BASE = "http://engine:8000"


@pytest.fixture
def autologged(tmp_path: Path) -> Iterator[str]:
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.tracing.reset()
    # an explicit artifact root: the default is ./mlruns of the cwd
    experiment_id = mlflow.create_experiment("app", artifact_location=tmp_path.as_uri())
    mlflow.set_experiment(experiment_id=experiment_id)
    mlflow.langchain.autolog()
    yield experiment_id
    mlflow.langchain.autolog(disable=True)
    mlflow.set_tracking_uri(previous)
    mlflow.tracing.reset()


def test_annotate_puts_the_call_on_autologs_chat_span(autologged: str) -> None:
    engine, rows = Engine(), []
    model = llm(engine)

    def planner(s: Loop) -> dict:
        model.invoke("plan")
        return {"n": s["n"] + 1}

    def executor(s: Loop) -> dict:
        model.invoke("do")
        return {}

    def sink(record: RequestRecord) -> None:
        rows.append(app_spans.annotate(record))

    ctx = CallContext("bench", "exp", "hash", "langgraph", 1, "smollm2", None, sink)
    app = planner_executor_loop(planner, executor)
    with Interceptor(VllmEngine(EngineConfig()), BASE, ctx):
        app.invoke({"n": 0}, {"configurable": {"thread_id": "t-1"}})
    mlflow.flush_trace_async_logging()
    assert len(rows) == 4
    trace_ids = {r.mlflow_trace_id for r in rows}
    assert None not in trace_ids and len(trace_ids) == 1
    traces = mlflow.search_traces(locations=[autologged], return_type="list")
    assert [t.info.trace_id for t in traces] == list(trace_ids)  # one trace per invocation
    chat = [s for s in traces[0].data.spans if s.span_type == "CHAT_MODEL"]
    assert len(chat) == 4  # autolog's own spans, no kvscope span beside them
    by_uuid = {s.attributes.get("request.uuid"): s for s in chat}
    for r in rows:
        a = by_uuid[r.request_uuid].attributes
        assert (a["agent.id"], a["gen_ai.agent.name"]) == (r.agent_id, r.agent_id)
        assert a["workflow.run_id"] == r.workflow_run_id
        assert a["gen_ai.conversation.id"] == "t-1"
        assert a["gen_ai.usage.input_tokens"] == r.prompt_tokens
        assert a["kv.cached_tokens"] == r.cached_tokens
    # at publish, kvscope writes no trace of its own for the invocation
    assert plan_traces([r.to_dict() for r in rows], [], {}) == []


def test_annotate_without_a_span_or_mlflow_leaves_the_record(monkeypatch: Any) -> None:
    record: Any = type("R", (), {"mlflow_trace_id": None, "request_uuid": "u"})()
    assert app_spans.annotate(record) is record  # MLflow imported, no active span
    monkeypatch.delitem(sys.modules, "mlflow")
    assert app_spans.annotate(record) is record  # the app has not imported MLflow
    assert "mlflow" not in sys.modules


def test_annotate_never_raises(monkeypatch: Any) -> None:
    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(mlflow, "get_current_active_span", broken)
    record: Any = type("R", (), {"mlflow_trace_id": None, "request_uuid": "u"})()
    assert app_spans.annotate(record) is record
