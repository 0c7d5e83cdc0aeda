"""kvscope's measurements on the app's own MLflow trace, live (e.g. `mlflow.langchain.autolog()`).

`annotate(record)` runs when a call's row is finished (CallStreams.row), in the app's thread or
task, inside the LLM client's call. If the app has imported MLflow and a span is active there:

- the active span is the call's model span (LLM / CHAT_MODEL: autolog's MlflowLangchainTracer
  attaches each span it starts to the context, and with its default `run_tracer_inline=True` also
  under async): kvscope's attributes (probe/span_attributes.py) and token usage go onto it;
- another span is active (the app's node span, a manual span): an `llm` child span with the
  call's own start and end times and kvscope's attributes is added under it.

The record then carries the span's `mlflow_trace_id`, and kvscope writes no trace of its own for
the invocation at publish (kvscope/traces.py). Otherwise the record is returned unchanged.

MLflow is never imported here unless the app already has (`"mlflow" in sys.modules`), and no
error reaches the app: failures are logged and the record is returned unchanged.
"""

import dataclasses
import logging
import sys
from typing import Any

from kvscope.probe.span_attributes import TOKEN_USAGE_KEY, llm_attributes, token_usage
from kvscope.records.requests import STATUS_OK, RequestRecord

log = logging.getLogger(__name__)

_MODEL_SPAN_TYPES = ("LLM", "CHAT_MODEL")
_NO_OP_TRACE_ID = "MLFLOW_NO_OP_SPAN_TRACE_ID"  # mlflow.tracing.constant.NO_OP_SPAN_TRACE_ID


def annotate(record: RequestRecord) -> RequestRecord:
    """The record, with `mlflow_trace_id` set if its measurements went onto the app's active
    MLflow span (see the module doc); never raises."""
    if "mlflow" not in sys.modules or record.mlflow_trace_id is not None:
        return record
    try:
        return _annotate(record)
    except Exception:  # the app's call must not fail for kvscope's tracing
        log.warning("could not put call %s on the app's MLflow span", record.request_uuid,
                    exc_info=True)  # fmt: skip
        return record


def active() -> bool:
    """Whether `annotate` would act on the caller's thread now: the app imported MLflow and a span
    of its own is active there (a call's row is then finished on the app's thread, not later on
    the capture's background thread, where the app's context is not). Never raises."""
    if "mlflow" not in sys.modules:
        return False
    try:
        span = sys.modules["mlflow"].get_current_active_span()
    except Exception:
        return False
    return span is not None and span.trace_id != _NO_OP_TRACE_ID


def _annotate(record: RequestRecord) -> RequestRecord:
    import mlflow

    span = mlflow.get_current_active_span()
    if span is None or span.trace_id == _NO_OP_TRACE_ID:
        return record
    row = vars(record)
    attributes: dict[str, Any] = llm_attributes(row) | {"gen_ai.operation.name": "chat"}
    if usage := token_usage(row):
        attributes[TOKEN_USAGE_KEY] = usage
    if str(span.span_type) in _MODEL_SPAN_TYPES:
        span.set_attributes(attributes)
    else:
        _child_span(mlflow, span, record, attributes)
    return dataclasses.replace(record, mlflow_trace_id=span.trace_id)


def _child_span(
    mlflow: Any, parent: Any, record: RequestRecord, attributes: dict[str, Any]
) -> None:
    """An `llm` span under the app's active span, timed as the call was."""
    from mlflow.entities import SpanStatus, SpanStatusCode, SpanType

    child = mlflow.start_span_no_context(
        "llm",
        span_type=SpanType.LLM,
        parent_span=parent,
        attributes=attributes,
        start_time_ns=record.start_ns,
    )
    status: Any = SpanStatusCode.OK
    if record.status != STATUS_OK:
        reason = record.error_message or record.error_type or record.status
        status = SpanStatus(SpanStatusCode.ERROR, reason)
    child.end(status=status, end_time_ns=record.end_ns)
