"""MLflow side of a benchmark: one run per configuration, one trace per workflow run.

Spans are opened by hand (no LangChain autolog: under async `ainvoke` it scatters manual spans
into stray one-span traces). They are sync context managers; MLflow keeps the current span in a
contextvar, so each asyncio task (one workflow) gets its own trace.

What MLflow 3.17 keeps process-global, and what this module does with it:
- the tracking URI (`mlflow.set_tracking_uri`, also exported as MLFLOW_TRACKING_URI to child
  processes) and the tracer provider, which reads that URI when it is built: traces can go to one
  store per process at a time. `TrackingRun.open` sets both.
- the active run: a thread-local stack, but traces link to the newest active run of *any* thread
  (metadata `mlflow.sourceRun`). One `TrackingRun` may be started at a time per process, and
  `start`/`finish` must run on the same thread.
- the trace export pipeline, configured by environment variables read when the tracer provider
  is built: an OTel BatchSpanProcessor (a fixed 2048-span queue, batches of
  MLFLOW_ASYNC_TRACE_LOGGING_MAX_SPAN_BATCH_SIZE) feeding an async write queue of
  MLFLOW_ASYNC_TRACE_LOGGING_MAX_QUEUE_SIZE tasks (one per span batch, one per trace). Both drop
  when full, with no error to the caller: `TrackingRun.finish` counts what reached the store.
"""

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import mlflow
from mlflow import MlflowClient
from mlflow.entities import (
    LiveSpan,
    Metric,
    Param,
    SpanStatus,
    SpanStatusCode,
    SpanType,
    Trace,
)

from kvscope.config import TrackingConfig
from kvscope.records.requests import STATUS_OK, RequestRecord
from kvscope.workload.runtime import CallIds

log = logging.getLogger(__name__)

SESSION_KEY = "mlflow.trace.session"
TOKEN_USAGE_KEY = "mlflow.chat.tokenUsage"
SIZE_STATS_KEY = "mlflow.trace.sizeStats"  # written by MLflow: {"num_spans": ..., ...}

QUEUE_SIZE_ENV = "MLFLOW_ASYNC_TRACE_LOGGING_MAX_QUEUE_SIZE"
TRACE_QUEUE_SIZE = 50_000  # MLflow's default: 1000 tasks
SPAN_BATCH_ENV = "MLFLOW_ASYNC_TRACE_LOGGING_MAX_SPAN_BATCH_SIZE"
# MLflow's default, 5, writes 5 spans per SQLite transaction; 50 halved the tracing CPU
# (2-core box: 126 -> 71 ms per 25-span workflow) and the final flush (9 s -> 3.4 s per 100).
SPAN_BATCH_SIZE = 50

PARAM_VALUE_LIMIT = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (MLflow 3.17)
TRUNCATED = " ...[truncated]"
_PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH

# LLM span attribute <- RequestRecord field
_RECORD_ATTRIBUTES = {
    "agent.id": "agent_id",
    "workflow.run_id": "workflow_run_id",
    "request.uuid": "request_uuid",
    "request.sglang_response_id": "sglang_response_id",
    "prompt.tokens": "prompt_tokens",
    "prompt.cached_tokens": "cached_tokens",
    "prompt.new_prefill_tokens": "new_prefill_tokens",
    "prompt.reported_cache_hit_ratio": "reported_cache_hit_ratio",
    "output.tokens": "output_tokens",
    "latency.ttft_ms": "ttft_ms",
    "latency.tpot_ms": "tpot_ms",
    "latency.e2e_ms": "e2e_ms",
    "tool.ms": "tool_ms",
    "result.status": "status",
    "result.error_type": "error_type",
    "result.finish_reason": "finish_reason",
}


def _known(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes without the unknown ones: None is left off the span, never written as 0."""
    return {k: v for k, v in attributes.items() if v is not None}


def token_usage(record: RequestRecord) -> dict[str, int]:
    """`mlflow.chat.tokenUsage` from what the engine reported (only the known keys)."""
    usage: dict[str, int] = {}
    if record.prompt_tokens is not None:
        usage["input_tokens"] = record.prompt_tokens
    if record.output_tokens is not None:
        usage["output_tokens"] = record.output_tokens
    if record.prompt_tokens is not None and record.output_tokens is not None:
        usage["total_tokens"] = record.prompt_tokens + record.output_tokens
    if record.cached_tokens is not None:
        usage["cache_read_input_tokens"] = record.cached_tokens
    return usage


class ToolSpanHandle:
    """What `Tracer.tool` yields (satisfies kvscope.workload.runtime.ToolSpan)."""

    def __init__(self, span: LiveSpan | None) -> None:
        self._span = span

    def set_output(self, output: Any) -> None:
        if self._span is not None:
            self._span.set_outputs(output)


class LlmSpan:
    """What `Tracer.llm` yields; `finish` puts the measured request on the span."""

    def __init__(self, span: LiveSpan | None) -> None:
        self._span = span

    def finish(self, record: RequestRecord, content: str | None) -> None:
        if self._span is None:
            return
        self._span.set_attributes(
            _known({a: getattr(record, f) for a, f in _RECORD_ATTRIBUTES.items()})
        )
        if usage := token_usage(record):
            self._span.set_attribute(TOKEN_USAGE_KEY, usage)
        if content is not None:
            self._span.set_outputs(content)
        if record.status != STATUS_OK:
            reason = record.error_message or record.error_type or record.status
            self._span.set_status(SpanStatus(SpanStatusCode.ERROR, description=reason))


class Tracer:
    """Manual MLflow spans: workflow (root, one trace) > agent > tool / llm.

    Traces link to the MLflow run active when `workflow` is entered (see TrackingRun).
    With enabled=False every method is a no-op and nothing reaches MLflow.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    @contextmanager
    def workflow(
        self, benchmark_run_id: str, thread_id: str, workflow_run_id: str, workflow_type: str
    ) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        ids = {
            "benchmark.run_id": benchmark_run_id,
            "workflow.run_id": workflow_run_id,
            "workflow.type": workflow_type,
            "thread.id": thread_id,
        }
        with mlflow.start_span(workflow_type, span_type=SpanType.WORKFLOW, attributes=ids) as span:
            span.set_inputs({"thread_id": thread_id, "workflow_run_id": workflow_run_id})
            mlflow.update_current_trace(tags=ids, metadata={SESSION_KEY: thread_id})
            yield

    @contextmanager
    def agent(self, ids: CallIds) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        attributes = _known(
            {
                "agent.id": ids.agent_id,
                "agent.previous_id": ids.previous_agent_id,
                "agent.turn_id": ids.turn_id,
                "workflow.run_id": ids.workflow_run_id,
                "thread.id": ids.thread_id,
                "graph.node": ids.graph_node,
            }
        )
        with mlflow.start_span(ids.agent_id, span_type=SpanType.AGENT, attributes=attributes):
            yield

    @contextmanager
    def tool(self, name: str, inputs: dict[str, Any]) -> Iterator[ToolSpanHandle]:
        if not self.enabled:
            yield ToolSpanHandle(None)
            return
        with mlflow.start_span(name, span_type=SpanType.TOOL) as span:
            span.set_inputs(inputs)
            yield ToolSpanHandle(span)

    @contextmanager
    def llm(
        self, ids: CallIds, request_uuid: str, messages: list[dict[str, str]], model: str
    ) -> Iterator[LlmSpan]:
        if not self.enabled:
            yield LlmSpan(None)
            return
        # Identity goes on at start so that a call that raises still says whose it was.
        attributes = {
            "agent.id": ids.agent_id,
            "agent.turn_id": ids.turn_id,
            "workflow.run_id": ids.workflow_run_id,
            "request.uuid": request_uuid,
            "mlflow.llm.model": model,
        }
        with mlflow.start_span("llm", span_type=SpanType.LLM, attributes=attributes) as span:
            span.set_inputs({"model": model, "messages": messages})
            yield LlmSpan(span)


@dataclass(frozen=True)
class TraceAudit:
    """Traces expected (workflow runs) vs. traces the store holds complete for the run."""

    expected: int
    written: int
    dropped: int  # expected - written, never negative
    incomplete: int = 0  # linked to the run but with spans missing (counted in dropped)


class UiCommand(NamedTuple):
    argv: list[str]
    env: dict[str, str]  # additions to the caller's environment


def truncate_param(value: str) -> str:
    if len(value) <= PARAM_VALUE_LIMIT:
        return value
    return value[: PARAM_VALUE_LIMIT - len(TRUNCATED)] + TRUNCATED


class TrackingRun:
    """The MLflow run of one configuration. Call order: open -> start -> (trace) -> finish."""

    def __init__(self, client: MlflowClient, tracking_uri: str, experiment_id: str) -> None:
        self.client = client
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.run_id: str | None = None

    @classmethod
    def open(cls, cfg: TrackingConfig, runs_dir: Path) -> "TrackingRun":
        """Point MLflow at the store and create the experiment if missing.

        Sets the process-global tracking URI and rebuilds MLflow's tracer provider
        (`mlflow.tracing.reset`, which also clears `mlflow.tracing.configure` settings): call it
        before any span is opened, and configure tracing, if at all, after it.
        """
        runs_dir = runs_dir.resolve()
        uri = cfg.tracking_uri or local_store_uri(runs_dir)
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(cfg.experiment)
        if experiment is None:
            # A local store gets an explicit artifact root: the default is ./mlruns of the cwd.
            root = (runs_dir / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
            experiment_id = client.create_experiment(cfg.experiment, artifact_location=root)
        else:
            experiment_id = experiment.experiment_id
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment_id)
        # Read when the tracer provider is built: set them, then rebuild it.
        # Values the user exported are kept; the audit in finish() catches drops either way.
        os.environ.setdefault(QUEUE_SIZE_ENV, str(TRACE_QUEUE_SIZE))
        os.environ.setdefault(SPAN_BATCH_ENV, str(SPAN_BATCH_SIZE))
        mlflow.set_tracking_uri(uri)
        mlflow.tracing.reset()
        return cls(client, uri, experiment_id)

    def start(self, run_name: str, params: dict[str, object], tags: dict[str, str]) -> str:
        """Start (and make active) the run; traces started from now on link to it."""
        run = mlflow.start_run(experiment_id=self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        items = [Param(k, truncate_param(str(v))) for k, v in params.items()]
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + _PARAMS_PER_BATCH])
        return self.run_id

    def log_metrics(self, metrics: dict[str, float]) -> None:
        """Run-level summaries (logged once, step 0)."""
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, 0) for k, v in metrics.items()]
        self.client.log_batch(self._run(), metrics=batch)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self._run(), str(path), artifact_path)

    def log_dict(self, obj: dict[str, Any], name: str) -> None:
        """`obj` as JSON (or YAML, by the name's suffix) at artifact path `name`."""
        self.client.log_dict(self._run(), obj, name)

    def finish(self, expected_traces: int, status: str = "FINISHED") -> TraceAudit:
        """Flush the trace queue, audit the traces of this run, log the audit, end the run."""
        run_id = self._run()
        try:
            mlflow.flush_trace_async_logging()
            audit = self.audit(expected_traces)
            self.log_metrics(
                {
                    "traces_expected": audit.expected,
                    "traces_written": audit.written,
                    "traces_dropped": audit.dropped,
                    "traces_incomplete": audit.incomplete,
                }
            )
            if audit.dropped:
                log.warning(
                    "MLflow run %s: %d of %d traces missing or incomplete in the store",
                    run_id,
                    audit.dropped,
                    audit.expected,
                )
        finally:
            mlflow.end_run(status=status)
        return audit

    def audit(self, expected_traces: int) -> TraceAudit:
        """Count this run's traces that reached the store with all their spans.

        A queue drop can lose a whole trace, or only some span batches: MLflow then keeps a
        trace row with fewer spans than its `sizeStats.num_spans`, or skips it when loading
        spans. Only traces that load with every span count as written.
        """
        run_id = self._run()
        linked = len(self._search(run_id, include_spans=False))
        written = sum(map(trace_complete, self._search(run_id, include_spans=True)))
        dropped = max(expected_traces - written, 0)
        return TraceAudit(expected_traces, written, dropped, max(linked - written, 0))

    def _search(self, run_id: str, include_spans: bool) -> list[Trace]:
        traces: list[Trace] = []
        token: str | None = None
        while True:
            page = self.client.search_traces(
                locations=[self.experiment_id],
                run_id=run_id,
                include_spans=include_spans,
                max_results=500,
                page_token=token,
            )
            traces.extend(page)
            token = page.token
            if not token:
                return traces

    def _run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("TrackingRun.start() has not been called")
        return self.run_id

    @staticmethod
    def ui_command(runs_dir: Path, port: int = 5000) -> UiCommand:
        """`mlflow server` on the local store: 1 worker, no job runner (ready in ~6 s)."""
        runs_dir = runs_dir.resolve()
        argv = [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", local_store_uri(runs_dir),
            "--default-artifact-root", (runs_dir / "mlartifacts").as_uri(),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--workers", "1",
        ]  # fmt: skip
        return UiCommand(argv, {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})


def local_store_uri(runs_dir: Path) -> str:
    return f"sqlite:///{runs_dir.resolve() / 'mlflow.db'}"


def trace_complete(trace: Trace) -> bool:
    stats = json.loads(trace.info.trace_metadata.get(SIZE_STATS_KEY) or "{}")
    return len(trace.data.spans) >= int(stats.get("num_spans", 1))
