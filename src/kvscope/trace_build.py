"""kvscope's trace plans, and the MLflow traces built from them without MLflow's tracer.

A `TracePlan` (a tree of `SpanPlan`s with explicit times, and the trace's tags and metadata) is
what traces.py plans from a run's streams. `build_trace` makes from one what MLflow stores of a
trace: its spans in `mlflow.entities.Span.to_dict()` form and its `TraceInfo`, with the content
the fluent API gives them (`mlflow.start_span_no_context` and `LiveSpan.end` for each span, then
MLflow's span processor and exporter: mlflow/tracing/processor/base_mlflow.py,
mlflow/tracing/export/mlflow_v3.py, MLflow 3.17):
- each span: MLflow's attributes in the same order (`mlflow.spanStartTimeNs`, the root's
  `mlflow.experimentId`, `mlflow.traceRequestId`, `mlflow.spanType`, `mlflow.spanInputs`,
  kvscope's, `mlflow.spanOutputs`, `mlflow.spanLogLevel`), each value JSON as
  `LiveSpan.set_attribute` writes it; status OK, or ERROR with its description; no events;
- the trace: the environment metadata MLflow resolves once per process (user, source, git),
  the schema version, the source run, the plan's metadata, the root's inputs and outputs (cut as
  MLflow cuts them), the token usage summed as MLflow sums it, the size stats (`num_spans` is
  what the run's audit checks); tags: `mlflow.traceName` (the root's name) and the plan's;
  state OK or ERROR from the root; request time and duration from the root's times.
Ids: 64-bit span ids random as OpenTelemetry's are; the 128-bit trace id (`tr-<32 hex>`) is the
root's start time in ns (its high 64 bits) and 64 random bits, so a run's traces, written in
time order, reach the store's indexes in key order (random ids doubled the inserts' time at
20,000 traces). tests/unit/test_traces.py checks a bulk-written trace against a fluent one.

A span value MLflow would move out into an attachment (a base64 image or audio in a payload)
is not handled here: `build_trace` answers None for such a trace, to be written the fluent way.
"""

import base64
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import TraceInfo, TraceLocation, TraceState
from mlflow.tracing.constant import (
    MAX_CHARS_IN_TRACE_INFO_METADATA,
    TRACE_SCHEMA_VERSION,
    TRACE_SCHEMA_VERSION_KEY,
    TRUNCATION_SUFFIX,
    SpanAttributeKey,
    TokenUsageKey,
    TraceMetadataKey,
    TraceSizeStatsKey,
    TraceTagKey,
)
from mlflow.tracing.utils import (
    SpanAggregationNode,
    aggregate_cost_from_span_nodes,
    calculate_cost_by_model_and_token_usage,
)
from mlflow.tracing.utils.default_log_level import default_log_level_for_span_type
from mlflow.tracing.utils.environment import resolve_env_metadata
from mlflow.tracing.utils.truncation import _get_truncated_preview

from kvscope.probe.span_attributes import TOKEN_USAGE_KEY
from kvscope.span_json import dump_value as _dump
from kvscope.span_json import dumps as _dumps
from kvscope.span_json import dumps_ascii as _dumps_ascii


@dataclass
class SpanPlan:
    """One span to write: explicit times, attributes without None values."""

    name: str
    span_type: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    inputs: Any = None
    outputs: Any = None
    error: str | None = None  # set: status ERROR with this description
    children: list["SpanPlan"] = field(default_factory=list)

    def span_count(self) -> int:
        return 1 + sum(c.span_count() for c in self.children)


@dataclass(frozen=True)
class TracePlan:
    root: SpanPlan
    tags: dict[str, str]
    metadata: dict[str, str]


@dataclass(frozen=True)
class SpanKey:
    """What the store keeps of a span beside its content: hex ids, type, status, model."""

    span_id: str
    parent_id: str | None
    span_type: str
    status: str  # SpanStatusCode's value: OK, ERROR
    model: Any  # the `mlflow.llm.model` attribute, None if unset
    cost: dict[str, float] | None  # what the store prices the call at (`mlflow.llm.cost`)


@dataclass(frozen=True)
class BuiltTrace:
    """One trace as MLflow stores it: its info, its spans (`Span.to_dict()` form, root first),
    each span as the store keeps it (`contents`: JSON, attributes as MLflow's store-side
    translation leaves them), their `keys` and the trace's cost as the store sums it (None: no
    span priced)."""

    info: TraceInfo
    spans: list[dict[str, Any]]
    contents: list[str]
    keys: list[SpanKey]
    cost: dict[str, float] | None


# Inside a span value, what LiveSpan.set_inputs / set_outputs moves out into an attachment
# (MLFLOW_TRACE_EXTRACT_ATTACHMENTS): a data URI, base64 audio, images (entities/span.py).
_ATTACHMENT_MARKS = (";base64,", '"b64_json"', '"input_audio"', '"inline_data"', '"audio"',
                     '"image"', '"image_generation_call"')  # fmt: skip
_JSON_OPENERS = ("{", "[", '"')
_JSON_FIRST = frozenset('{[" \t\n\r')
_LOW64 = (1 << 64) - 1


def environment_metadata() -> dict[str, str]:
    """The trace metadata MLflow resolves once per span processor (user, source, git)."""
    return dict(resolve_env_metadata())


def build_trace(
    plan: TracePlan, experiment_id: str, run_id: str, env: dict[str, str]
) -> BuiltTrace | None:
    """The trace of `plan` in `experiment_id`, its source run `run_id` (`env`: what
    `environment_metadata` returned); None where a span's inputs or outputs may hold what
    MLflow's tracer moves out into an attachment."""
    otel_trace_id = (plan.root.start_ns & _LOW64) << 64 | (random.getrandbits(64) or 1)
    trace_id = f"tr-{otel_trace_id:032x}"
    head = {SpanAttributeKey.REQUEST_ID: _dump(trace_id)}
    b64_trace = _b64(otel_trace_id, 16)
    spans: list[dict[str, Any]] = []
    contents: list[str] = []
    keys: list[SpanKey] = []
    sizes: list[int] = []
    usage = _Usage()
    # (span, its parent's id, whether an ancestor has token usage), parents first
    stack: list[tuple[SpanPlan, int | None, bool]] = [(plan.root, None, False)]
    while stack:
        node, parent, covered = stack.pop()
        span_id = random.getrandbits(64) or 1
        raw: dict[str, Any] = {}
        if node.start_ns:  # start_detached_span sets it where the start time is truthy
            raw[SpanAttributeKey.START_TIME_NS] = str(node.start_ns)
        if parent is None:
            raw[SpanAttributeKey.EXPERIMENT_ID] = _dump(experiment_id)
        raw |= head
        raw[SpanAttributeKey.SPAN_TYPE] = _dump(node.span_type)
        if node.inputs is not None:
            raw[SpanAttributeKey.INPUTS] = node.inputs
        raw |= node.attributes
        if node.outputs is not None:
            raw[SpanAttributeKey.OUTPUTS] = node.outputs
        attributes = {k: v if k in _PREDUMPED else _dump(v) for k, v in raw.items()}
        if _may_attach(attributes):
            return None
        attributes[SpanAttributeKey.LOG_LEVEL] = _log_level(node.span_type)
        span = {
            "trace_id": b64_trace,
            "span_id": _b64(span_id, 8),
            "parent_span_id": _b64(parent, 8) if parent is not None else None,
            "name": node.name,
            "start_time_unix_nano": node.start_ns,
            "end_time_unix_nano": node.end_ns,
            "events": [],
            "status": {
                "code": "STATUS_CODE_ERROR" if node.error else "STATUS_CODE_OK",
                "message": node.error or "",
            },
            "attributes": attributes,
            "links": [],
        }
        tokens = node.attributes.get(TOKEN_USAGE_KEY)
        model = node.attributes.get(SpanAttributeKey.MODEL)
        cost = _cost(model, tokens)
        content, size = _stored(span, raw, cost)
        spans.append(span)
        contents.append(content)
        sizes.append(size)
        parent_id = f"{parent:016x}" if parent is not None else None
        status = "ERROR" if node.error else "OK"
        keys.append(SpanKey(f"{span_id:016x}", parent_id, node.span_type, status, model, cost))
        if tokens is not None and not covered:
            usage.add(tokens)
        covered = covered or tokens is not None
        stack.extend((c, span_id, covered) for c in reversed(node.children))
    info = _info(plan, trace_id, experiment_id, run_id, env, spans[0]["attributes"])
    if usage.found:
        info.trace_metadata[TraceMetadataKey.TOKEN_USAGE] = json.dumps(usage.totals)
    _add_size_stats(info, sizes)
    cost = None
    if any(k.cost for k in keys):
        nodes = [SpanAggregationNode(k.span_id, k.parent_id, k.cost) for k in keys]
        cost = aggregate_cost_from_span_nodes(nodes)
    return BuiltTrace(info, spans, contents, keys, cost)


def _cost(model: Any, tokens: dict[str, int] | None) -> dict[str, float] | None:
    """What the store's translation prices a span with token usage and a model at (MLflow's
    price table, or litellm's where installed); a model without a price is looked up once."""
    if tokens is None or model is None:
        return None
    if (priced := _PRICED.get(model)) is None:
        sample = {TokenUsageKey.INPUT_TOKENS: 1, TokenUsageKey.OUTPUT_TOKENS: 1}
        priced = _PRICED[model] = calculate_cost_by_model_and_token_usage(model, sample) is not None
    return calculate_cost_by_model_and_token_usage(model, tokens) if priced else None


_PRICED: dict[Any, bool] = {}


class _Usage:
    """A trace's token usage as mlflow.tracing.utils.aggregate_usage_from_spans sums it: the
    spans with usage and no ancestor with usage; input, output and total always, the cache
    counts where a span has them."""

    KEYS = (TokenUsageKey.INPUT_TOKENS, TokenUsageKey.OUTPUT_TOKENS, TokenUsageKey.TOTAL_TOKENS)

    def __init__(self) -> None:
        self.totals: dict[str, int] = dict.fromkeys(self.KEYS, 0)
        self.found = False

    def add(self, tokens: dict[str, int]) -> None:
        for key in self.KEYS:
            self.totals[key] += tokens.get(key, 0)
        for key in TokenUsageKey.cache_keys():
            if key in tokens:
                self.totals[key] = self.totals.get(key, 0) + tokens[key]
        self.found = True


def _log_level(span_type: str) -> str:
    """LiveSpan.end's `mlflow.spanLogLevel` for a span of this type, as stored."""
    if (level := _LOG_LEVELS.get(span_type)) is None:
        level = _LOG_LEVELS[span_type] = str(int(default_log_level_for_span_type(span_type)))
    return level


_LOG_LEVELS: dict[str, str] = {}


def _may_attach(attributes: dict[str, str]) -> bool:
    for key in (SpanAttributeKey.INPUTS, SpanAttributeKey.OUTPUTS):
        value = attributes.get(key)
        if value is not None and any(mark in value for mark in _ATTACHMENT_MARKS):
            return True
    return False


# Values set as they are, not as JSON of themselves: start_detached_span dumps the start time
# and experiment id itself; the trace id is dumped once for all of a trace's spans.
_PREDUMPED = frozenset({SpanAttributeKey.START_TIME_NS, SpanAttributeKey.EXPERIMENT_ID,
                        SpanAttributeKey.REQUEST_ID, SpanAttributeKey.SPAN_TYPE})  # fmt: skip


def _info(
    plan: TracePlan,
    trace_id: str,
    experiment_id: str,
    run_id: str,
    env: dict[str, str],
    root_attributes: dict[str, str],
) -> TraceInfo:
    """As MlflowV3SpanProcessor starts it, BaseMlflowSpanProcessor._update_trace_info ends it
    and the trace manager hands it to the exporter, with the previews of the root's inputs and
    outputs (the root's attributes: as dumped, before the store's translation)."""
    metadata = env | {TRACE_SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION)}
    metadata |= plan.metadata | {TraceMetadataKey.SOURCE_RUN: run_id}
    for key, attribute in ((TraceMetadataKey.INPUTS, SpanAttributeKey.INPUTS),
                           (TraceMetadataKey.OUTPUTS, SpanAttributeKey.OUTPUTS)):  # fmt: skip
        metadata[key] = _cut(root_attributes.get(attribute))
    root = plan.root
    inputs, outputs = (root_attributes.get(a) for a in (SpanAttributeKey.INPUTS,
                                                          SpanAttributeKey.OUTPUTS))  # fmt: skip
    return TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=root.start_ns // 1_000_000,
        execution_duration=(root.end_ns - root.start_ns) // 1_000_000,
        state=TraceState.ERROR if root.error else TraceState.OK,
        trace_metadata=metadata,
        tags={TraceTagKey.TRACE_NAME: root.name} | plan.tags,
        request_preview=None if inputs is None else _get_truncated_preview(inputs, "user"),
        response_preview=None if outputs is None else _get_truncated_preview(outputs,
                                                                              "assistant"),
    )  # fmt: skip


def _cut(value: str | None) -> str:
    """BaseMlflowSpanProcessor._truncate_metadata."""
    if not value:
        return ""
    if len(value) > MAX_CHARS_IN_TRACE_INFO_METADATA:
        keep = MAX_CHARS_IN_TRACE_INFO_METADATA - len(TRUNCATION_SUFFIX)
        return value[:keep] + TRUNCATION_SUFFIX
    return value


def _add_size_stats(info: TraceInfo, sizes: list[int]) -> None:
    """mlflow.tracing.utils.add_size_stats_to_trace_metadata, from the spans' sizes."""
    total = sum(sizes) + _info_size(info) + (len(sizes) - 1) * 2
    ordered = sorted(sizes)
    stats = {
        TraceSizeStatsKey.TOTAL_SIZE_BYTES: total,
        TraceSizeStatsKey.NUM_SPANS: len(sizes),
        TraceSizeStatsKey.MAX_SPAN_SIZE_BYTES: ordered[-1],
        TraceSizeStatsKey.P25_SPAN_SIZE_BYTES: int(_percentile(ordered, 0.25)),
        TraceSizeStatsKey.P50_SPAN_SIZE_BYTES: int(_percentile(ordered, 0.50)),
        TraceSizeStatsKey.P75_SPAN_SIZE_BYTES: int(_percentile(ordered, 0.75)),
    }
    info.trace_metadata[TraceMetadataKey.SIZE_STATS] = json.dumps(stats)
    info.trace_metadata[TraceMetadataKey.SIZE_BYTES] = str(total)


def _info_size(info: TraceInfo) -> int:
    """len(Trace(info, TraceData(spans=[])).to_json()) (ASCII: its UTF-8 bytes), without the
    protobuf round trip of `TraceInfo.to_dict` (a fifth of a trace's build): the same keys and
    values in another order (the length is the same). MessageToDict leaves out unset fields
    and empty maps, writes the request time as RFC 3339; to_dict the duration in ms.
    tests/unit/test_trace_build.py checks it against MLflow's."""
    seconds, ms = divmod(info.request_time, 1000)
    experiment_id = getattr(info.trace_location.mlflow_experiment, "experiment_id", None)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    out: dict[str, Any] = {
        "trace_id": info.trace_id,
        "trace_location": {"type": "MLFLOW_EXPERIMENT",
                           "mlflow_experiment": {"experiment_id": experiment_id}},
        "request_time": f"{stamp}.{ms:03d}Z" if ms else f"{stamp}Z",
        "state": info.state.value,
    }  # fmt: skip
    out |= {k: v for k, v in (("trace_metadata", info.trace_metadata), ("tags", info.tags)) if v}
    optional = {"request_preview": info.request_preview, "client_request_id":
                info.client_request_id, "response_preview": info.response_preview}  # fmt: skip
    out |= {k: v for k, v in optional.items() if v is not None}
    if info.execution_duration is not None:
        out["execution_duration_ms"] = info.execution_duration
    return len(json.dumps({"info": out, "data": {"spans": []}}))


def _percentile(ordered: list[int], q: float) -> float:
    """mlflow.tracing.utils._calculate_percentile: linear between the nearest two."""
    index = q * (len(ordered) - 1)
    lower = int(index)
    if lower + 1 >= len(ordered):
        return ordered[-1]
    weight = index - lower
    return ordered[lower] * (1 - weight) + ordered[lower + 1] * weight


def _stored(
    span: dict[str, Any], raw: dict[str, Any], cost: dict[str, float] | None
) -> tuple[str, int]:
    """The span as the store keeps it (JSON, non-ASCII kept) and its size as MLflow counts it
    for the size stats (the JSON of `Span.to_dict()`, ASCII-escaped, in UTF-8 bytes).

    The store's translation (mlflow/tracing/otel/translation) keeps a text value that is itself
    JSON of a string, object or array as that text, not as JSON of it (`sanitize_attributes`),
    and adds the call's cost where its model has a price; its other translations
    (OpenTelemetry schemas' inputs, outputs, usage and model names, message format) find
    nothing to do on kvscope's spans, which carry MLflow's own keys (tests/unit/
    test_trace_build.py checks each span against it).
    """
    loose = {k: v for k, v in raw.items() if type(v) is str and v[:1] in _JSON_FIRST
             and k not in _PREDUMPED and _is_json_text(v)}  # fmt: skip
    if cost:
        loose[SpanAttributeKey.LLM_COST] = _dump(cost)
    stored = span | {"attributes": span["attributes"] | loose} if loose else span
    content = _dumps(stored)
    size = len(content) if not loose and content.isascii() else len(_dumps_ascii(span))
    return content, size


def _is_json_text(text: str) -> bool:
    if not text.lstrip(" \t\n\r").startswith(_JSON_OPENERS):
        return False
    try:
        return isinstance(json.loads(text), (str, dict, list))
    except ValueError:
        return False


def _b64(value: int, size: int) -> str:
    return base64.b64encode(value.to_bytes(size, "big")).decode()
