"""kvscope.trace_build: a planned trace built as MLflow stores it, checked against MLflow's own
functions for each step the fluent path takes (attribute JSON, the store's translation, the
size stats, the token usage)."""

import base64
import json
import math
from typing import Any

import pytest
from mlflow.entities import Span, Trace, TraceData
from mlflow.tracing.constant import TraceMetadataKey
from mlflow.tracing.otel.translation import translate_span_when_storing
from mlflow.tracing.utils import (
    TraceJSONEncoder,
    add_size_stats_to_trace_metadata,
    aggregate_usage_from_spans,
    dump_span_attribute_value,
)
from test_traces import FAILED, MEASURED, graph_row, row

from kvscope.records.payloads import CallPayload
from kvscope.records.tools import ToolCall
from kvscope.trace_build import BuiltTrace, TracePlan, _dump, _info_size, build_trace
from kvscope.traces import plan_traces

MS = 1_000_000
ENV = {"mlflow.user": "someone", "mlflow.source.type": "LOCAL"}
PRICED = MEASURED | {"model_name": "gpt-4o-mini"}  # a model with a price in MLflow's table
# a tool's output that is itself JSON, text outside ASCII, a priced model, a failed call
ROWS = [
    graph_row("p1", 0, "wf", "planner", 1, **MEASURED),
    graph_row("e1", 20, "wf", "executor", 1, previous_agent_id="planner", **PRICED),
    graph_row("r1", 40, "wf", "reviewer", 1, previous_agent_id="executor", **FAILED),
    row("lone", 100, thread_id="t-lone", **MEASURED),
]
TOOLS = [ToolCall("lookup", "wf", "executor", 22 * MS, 25 * MS, None, "ü?", '{"rows": [1, 2]}')]
PAYLOADS = {
    "p1": CallPayload("p1", {"messages": [{"role": "user", "content": "Grüße, 你好"}]}, "ok"),
    "lone": CallPayload("lone", {"messages": [{"role": "user", "content": "hi"}]}, '"quoted"'),
}


def plans() -> list[TracePlan]:
    return plan_traces(ROWS, TOOLS, PAYLOADS)


def built() -> list[BuiltTrace]:
    out = [build_trace(p, "7", "run-1", ENV) for p in plans()]
    assert all(t is not None for t in out)
    return [t for t in out if t is not None]


@pytest.mark.parametrize(
    "value",
    ["plain", 'quote " and \\ back', "Grüße 你好 \u2028", "", "\x00\x1f", 0, -12, 2**70,
     1.5, 0.1 + 0.2, 1e300, math.nan, math.inf, -math.inf, True, None, [1, "a"],
     {"k": [1.0, None]}],
)  # fmt: skip
def test_attribute_json_is_mlflows(value: Any) -> None:
    assert _dump(value) == dump_span_attribute_value(value)


def test_spans_are_stored_as_mlflows_translation_stores_them() -> None:
    for trace in built():
        for span, content in zip(trace.spans, trace.contents, strict=True):
            translated = translate_span_when_storing(Span.from_dict(span))
            assert json.loads(content) == translated
            assert content == json.dumps(translated, cls=TraceJSONEncoder, ensure_ascii=False)
    wf, lone = built()
    tool = next(s for s in wf.spans if s["name"] == "lookup")
    assert json.loads(tool["attributes"]["mlflow.spanOutputs"]) == '{"rows": [1, 2]}'
    content = json.loads(next(c for c in wf.contents if '"lookup"' in c))
    assert json.loads(content["attributes"]["mlflow.spanOutputs"]) == {"rows": [1, 2]}
    stored = json.loads(lone.contents[0])["attributes"]["mlflow.spanOutputs"]
    assert stored == '"quoted"'  # the JSON of a string, stored as that text
    assert lone.info.response_preview == json.dumps('"quoted"')  # the client's: as dumped


def test_size_stats_and_token_usage_are_mlflows() -> None:
    for trace in built():
        spans = [Span.from_dict(s) for s in trace.spans]
        info = trace.info
        ours = {k: info.trace_metadata.pop(k) for k in (TraceMetadataKey.SIZE_STATS,
                                                          TraceMetadataKey.SIZE_BYTES)}  # fmt: skip
        theirs = Trace(info, TraceData(spans=spans))
        add_size_stats_to_trace_metadata(theirs)
        assert ours[TraceMetadataKey.SIZE_STATS] == info.trace_metadata[TraceMetadataKey.SIZE_STATS]
        assert json.loads(info.trace_metadata[TraceMetadataKey.TOKEN_USAGE]) == (
            aggregate_usage_from_spans(spans))  # fmt: skip


def test_the_trace_as_the_fluent_path_starts_and_ends_it() -> None:
    wf, lone = built()
    root = wf.spans[0]
    assert (root["name"], root["parent_span_id"]) == ("langgraph", None)
    assert list(lone.spans[0]["attributes"])[:4] == [
        "mlflow.spanStartTimeNs", "mlflow.experimentId", "mlflow.traceRequestId",
        "mlflow.spanType"]  # fmt: skip
    assert "mlflow.spanStartTimeNs" not in root["attributes"]  # started at 0: not set, as MLflow
    assert root["attributes"]["mlflow.experimentId"] == '"7"'
    assert list(wf.spans[1]["attributes"])[-1] == "mlflow.spanLogLevel"
    assert root["status"] == {"code": "STATUS_CODE_ERROR", "message": "1 of 3 calls failed"}
    assert {k.span_id for k in wf.keys} >= {k.parent_id for k in wf.keys[1:]}
    info = wf.info
    assert info.trace_id == f"tr-{int.from_bytes(base64.b64decode(root['trace_id'])):032x}"
    assert (info.state.value, info.request_time, info.execution_duration) == ("ERROR", 0, 50)
    assert info.tags == {"mlflow.traceName": "langgraph", **plans()[0].tags}
    md = info.trace_metadata
    assert md["mlflow.sourceRun"] == "run-1" and md["mlflow.trace.session"] == "t-wf"
    assert md["mlflow.trace_schema.version"] == "3" and md["mlflow.user"] == "someone"
    assert md["mlflow.traceInputs"] == root["attributes"]["mlflow.spanInputs"]
    assert md["mlflow.traceOutputs"] == ""
    assert json.loads(md["mlflow.trace.sizeStats"])["num_spans"] == len(wf.spans) == 8
    assert lone.info.state.value == "OK" and lone.keys[0].model == "smollm2"
    priced = [k.cost for k in wf.keys if k.cost]
    assert len(priced) == 1 and priced[0]["total_cost"] > 0 and wf.cost == priced[0]
    assert lone.cost is None


def test_a_payload_mlflow_would_move_into_an_attachment_is_left_to_the_tracer() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    payloads = {"lone": CallPayload("lone", body, "ok")}
    (plan,) = plan_traces(ROWS[3:], [], payloads)
    assert build_trace(plan, "7", "run-1", ENV) is None


def test_trace_ids_ascend_with_the_roots_start() -> None:
    """The high 64 bits are the root's start (ns), the low 64 random: a run's traces reach the
    store's indexes in key order, and two traces starting at once still differ."""
    (plan,) = plan_traces(ROWS[3:], [], PAYLOADS)
    ids = [t.info.trace_id for t in (build_trace(plan, "7", "r", ENV) for _ in range(50)) if t]
    assert len(set(ids)) == 50
    assert {int(i.removeprefix("tr-"), 16) >> 64 for i in ids} == {plan.root.start_ns}
    first, later = plans()
    assert (
        build_trace(first, "7", "r", ENV).info.trace_id
        < build_trace(later, "7", "r", ENV).info.trace_id
    )  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("request_time", "previews", "duration", "client_id"),
    [(0, (None, None), 50, None), (1_764_300_000_123, ("Grüße", ""), None, "c-1"),
     (1_764_300_000_000, ("", "ok \u2028"), 0, None)],
)  # fmt: skip
def test_the_info_size_is_the_empty_traces_json(
    request_time: int, previews: tuple[str | None, str | None], duration: int | None,
    client_id: str | None,
) -> None:  # fmt: skip
    info = built()[0].info
    info.request_time, info.execution_duration, info.client_request_id = (
        request_time, duration, client_id)  # fmt: skip
    info.request_preview, info.response_preview = previews
    info.trace_metadata["note"] = '你好 "quoted"'
    assert _info_size(info) == len(Trace(info, TraceData(spans=[])).to_json().encode())
