"""The run's MLflow traces, written at publish from its streams (the app may have run in another
process, so nothing is traced live by kvscope itself).

One trace per graph invocation (workflow_run_id), linked to the kvscope MLflow run:

    <workflow_type>  WORKFLOW  first call's start .. last call's / tool's end
      -> <agent_id>  AGENT     one visit: consecutive calls of the same agent and turn_id
           -> llm    LLM       inputs: the request body (payloads.jsonl), outputs: the reply text
           -> <tool> TOOL      tools.jsonl, placed by time (below)
      -> llm                   a call no agent was named for

A call outside any graph (workflow_run_id None) is a trace of its own: one LLM span named `llm`.
The LLM span's attributes are probe/span_attributes.py's (design note, gen_ai.*, kv.*), from the
finalized table, so provenance is on them. A failed call's span has status ERROR with its error;
so has the root of an invocation with a failed call, or that raised (invocations.jsonl: the
probe's RunTracker saw the graph's root run end with an exception; the root then ends no earlier
than that).

A tool run joins a visit of its graph node's top-level segment: the one it ran within, else the
next one, else the last one before it; a tool of no visited node is a child of the root.

Invocations with a row whose `mlflow_trace_id` is set were traced by the app itself (autolog;
probe/app_spans.py put kvscope's attributes on its spans): kvscope writes no trace for them, and
links the app's traces to the kvscope run (an app in another process does not know that run).

Writing: in bulk (trace_writer.py: the traces built as MLflow would store them, many per store
operation: one transaction per 500 traces into the local SQLite store, one OTLP request per 100
to a tracking server); at publish, by a child process beside the report and by publish once its
report is written, time slices claimed from both ends (trace_job.py). The fluent way
(`write_trace`: `mlflow.start_span_no_context` for each span, exported through MLflow's
queues, paced by `Pace`) is kept for the stores that take no bulk writes and for traces whose
values MLflow's tracer would move into attachments.
"""

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import mlflow
import pyarrow as pa
from mlflow import MlflowClient
from mlflow.entities import LiveSpan, SpanStatus, SpanStatusCode, SpanType

from kvscope.gc_paused import gc_paused
from kvscope.probe.span_attributes import TOKEN_USAGE_KEY, llm_attributes, token_usage
from kvscope.records.base import Row
from kvscope.records.invocations import InvocationError, load_invocation_errors
from kvscope.records.payloads import CallPayload, load_payloads
from kvscope.records.requests import STATUS_OK
from kvscope.records.tools import ToolCall, load_tools
from kvscope.trace_build import SpanPlan, TracePlan
from kvscope.trace_writer import write_bulk

log = logging.getLogger(__name__)

SESSION_KEY = "mlflow.trace.session"
SOURCE_RUN_KEY = "mlflow.sourceRun"
LLM_SPAN = "llm"
_LINKS_PER_CALL = 100  # MlflowClient.link_traces_to_run's limit
# Spans ended between two drains of MLflow's export pipeline: half OTel's BatchSpanProcessor
# queue (2,048 spans, dropped silently when full; see Pace).
SPANS_IN_FLIGHT = 1024


@dataclass(frozen=True)
class TraceWrite:
    """What `write_traces` did: kvscope's traces started, the app's traces linked to the run."""

    written: int
    app_linked: int  # the app's own traces, in the run's experiment, linked to the run
    app_elsewhere: int = 0  # app trace ids not in the run's experiment (not audited)

    @property
    def expected(self) -> int:
        """Traces the run's audit should find: kvscope's and the app's linked ones."""
        return self.written + self.app_linked

    def __add__(self, other: "TraceWrite") -> "TraceWrite":  # two parts' writes together
        a, b = asdict(self), asdict(other)
        return TraceWrite(**{k: a[k] + b[k] for k in a})


@dataclass(frozen=True)
class Streams:
    """What the traces take from the run directory besides the finalized table: its tool runs,
    its calls' payloads, its invocations that raised. Written during the run (finalize leaves
    them as they are): trace_job.py reads them while the table is being finalized."""

    tools: list[ToolCall]
    payloads: dict[str, CallPayload]
    raised: dict[str, InvocationError]

    @classmethod
    def load(cls, run_dir: Path) -> "Streams":
        with gc_paused():
            return cls(load_tools(run_dir), load_payloads(run_dir),
                       load_invocation_errors(run_dir))  # fmt: skip


def write_traces(
    run_dir: Path,
    requests: pa.Table,
    *,
    client: MlflowClient,
    experiment_id: str,
    run_id: str,
    bulk: bool = True,
    on_planned: Callable[[int], None] = lambda _: None,
    streams: Streams | None = None,
) -> TraceWrite:
    """Write the traces of `requests` (the finalized table) with the run dir's tools.jsonl and
    payloads.jsonl (`streams`: those read already), linked to `run_id`: in bulk where the store
    takes it, the rest (all: `bulk=False`) through MLflow's export queue (flush before
    auditing: TrackingRun.finish does). `on_planned` hears how many traces kvscope writes
    before the first is written."""
    streams = streams or Streams.load(run_dir)
    with gc_paused():
        rows = requests.to_pylist()
        plans = plan_traces(rows, streams.tools, streams.payloads, streams.raised)
        on_planned(len(plans))
        fluent = write_bulk(plans, client.tracking_uri, experiment_id, run_id) if bulk else plans
        pace = Pace()
        for p in fluent:
            write_trace(p, experiment_id, run_id, pace)
    app_ids = sorted({r["mlflow_trace_id"] for r in rows if r.get("mlflow_trace_id")})
    linked = link_app_traces(client, app_ids, experiment_id, run_id)
    return TraceWrite(len(plans), linked, len(app_ids) - linked)


def plan_traces(
    rows: Sequence[Row],
    tools: Iterable[ToolCall],
    payloads: Mapping[str, CallPayload],
    raised: Mapping[str, InvocationError] | None = None,
) -> list[TracePlan]:
    """The traces kvscope writes for these rows (not the app-traced invocations), in time order;
    `raised`: the invocations that raised, by workflow_run_id."""
    raised = raised or {}
    rows = sorted(rows, key=lambda r: (r["start_ns"], r["request_uuid"]))
    by_run: dict[str | None, list[Row]] = {}
    for r in rows:
        by_run.setdefault(r["workflow_run_id"], []).append(r)
    tools_by_run: dict[str, list[ToolCall]] = {}
    for t in tools:
        if t.workflow_run_id is not None:
            tools_by_run.setdefault(t.workflow_run_id, []).append(t)
    plans = [_lone_call(r, payloads) for r in by_run.pop(None, []) if not r.get("mlflow_trace_id")]
    for run_id, calls in by_run.items():
        if any(r.get("mlflow_trace_id") for r in calls):
            continue  # the app traced this invocation
        assert run_id is not None
        plans.append(_invocation(calls, tools_by_run.get(run_id, []), payloads, raised.get(run_id)))
    return sorted(plans, key=lambda p: p.root.start_ns)


def _lone_call(row: Row, payloads: Mapping[str, CallPayload]) -> TracePlan:
    span = _llm(row, payloads)
    tags = _known({"benchmark.run_id": row["benchmark_run_id"]})
    return TracePlan(span, tags, _known({SESSION_KEY: row["thread_id"]}))


def _invocation(
    calls: list[Row],
    tools: list[ToolCall],
    payloads: Mapping[str, CallPayload],
    raised: InvocationError | None = None,
) -> TracePlan:
    first = calls[0]
    ids = _known(
        {
            "benchmark.run_id": first["benchmark_run_id"],
            "workflow.run_id": first["workflow_run_id"],
            "workflow.type": first["workflow_type"],
            "thread.id": first["thread_id"],
            "thread.turn": first.get("thread_turn"),
            "gen_ai.conversation.id": first["thread_id"],
        }
    )
    children = _children(calls, sorted(tools, key=lambda t: t.start_ns), payloads)
    start = min(c.start_ns for c in children)
    end = max(c.end_ns for c in children)
    failed = [r for r in calls if r["status"] != STATUS_OK]
    errors = [f"{len(failed)} of {len(calls)} calls failed"] if failed else []
    if raised is not None:
        end = max(end, raised.end_ns)
        errors.insert(0, raised.description)
    root = SpanPlan(
        name=str(first["workflow_type"] or "workflow"),
        span_type=SpanType.WORKFLOW,
        start_ns=start,
        end_ns=end,
        attributes=ids,
        inputs=_known(
            {"thread_id": first["thread_id"], "workflow_run_id": first["workflow_run_id"]}
        ),
        error="; ".join(errors) or None,
        children=children,
    )
    tags = {k: str(v) for k, v in ids.items() if k in ("benchmark.run_id", "workflow.run_id")}
    tags |= {k: str(v) for k, v in ids.items() if k in ("workflow.type", "thread.id")}
    return TracePlan(root, tags, _known({SESSION_KEY: first["thread_id"]}))


def _children(
    calls: list[Row], tools: list[ToolCall], payloads: Mapping[str, CallPayload]
) -> list[SpanPlan]:
    """The root's children: agent visits (with their calls and tools), unnamed calls, tools."""
    out: list[SpanPlan] = []
    visits: list[tuple[str | None, SpanPlan]] = []  # (top-level node, visit span)
    for key, group in groupby(calls, key=lambda r: (r["agent_id"], r["turn_id"])):
        group_calls = list(group)
        spans = [_llm(r, payloads) for r in group_calls]
        if key[0] is None:
            out.extend(spans)
            continue
        visit = _visit(group_calls[0], spans)
        visits.append((_top(group_calls[0]["graph_node"]), visit))
        out.append(visit)
    for t in tools:
        home = _home(t, [v for top, v in visits if top is not None and top == _top(t.graph_node)])
        (home.children if home else out).append(_tool(t))
    for _, visit in visits:
        visit.children.sort(key=lambda s: s.start_ns)
        visit.start_ns = min(c.start_ns for c in visit.children)
        visit.end_ns = max(c.end_ns for c in visit.children)
    return sorted(out, key=lambda s: s.start_ns)


def _home(tool: ToolCall, visits: list[SpanPlan]) -> SpanPlan | None:
    """The visit (of the tool's node, in time order) a tool run belongs to: the one it ran
    within, else the next one, else the last before it; None: no visit of its node."""
    within = [v for v in visits if v.start_ns <= tool.start_ns <= v.end_ns]
    after = [v for v in visits if v.start_ns > tool.start_ns]
    return (within or after[:1] or visits[-1:] or [None])[0]


def _top(graph_node: str | None) -> str | None:
    return graph_node.split("/", 1)[0] if graph_node else None


def _visit(first: Row, spans: list[SpanPlan]) -> SpanPlan:
    attributes = _known(
        {
            "agent.id": first["agent_id"],
            "agent.previous_id": first["previous_agent_id"],
            "agent.turn_id": first["turn_id"],
            "workflow.run_id": first["workflow_run_id"],
            "thread.id": first["thread_id"],
            "graph.node": first["graph_node"],
            "gen_ai.agent.name": first["agent_id"],
            "gen_ai.conversation.id": first["thread_id"],
            "gen_ai.operation.name": "invoke_agent",
        }
    )
    start, end = min(s.start_ns for s in spans), max(s.end_ns for s in spans)
    return SpanPlan(str(first["agent_id"]), SpanType.AGENT, start, end, attributes, children=spans)


def _llm(row: Row, payloads: Mapping[str, CallPayload]) -> SpanPlan:
    attributes = llm_attributes(row) | {"gen_ai.operation.name": "chat"}
    if usage := token_usage(row):
        attributes[TOKEN_USAGE_KEY] = usage
    if row.get("model_name"):
        attributes["mlflow.llm.model"] = row["model_name"]
    payload = payloads.get(row["request_uuid"])
    error = None
    if row["status"] != STATUS_OK:
        error = row.get("error_message") or row.get("error_type") or row["status"]
    return SpanPlan(
        name=LLM_SPAN,
        span_type=SpanType.LLM,
        start_ns=row["start_ns"],
        end_ns=row["end_ns"],
        attributes=attributes,
        inputs=payload.inputs if payload else None,
        outputs=payload.output if payload else None,
        error=error,
    )


def _tool(t: ToolCall) -> SpanPlan:
    attributes = _known(
        {
            "tool.name": t.name,
            "graph.node": t.graph_node,
            "workflow.run_id": t.workflow_run_id,
            "gen_ai.tool.name": t.name,
            "gen_ai.operation.name": "execute_tool",
            "result.error_type": t.error,
        }
    )
    inputs = {"input": t.input} if t.input is not None else None
    return SpanPlan(t.name, SpanType.TOOL, t.start_ns, t.end_ns, attributes, inputs, t.output,
                    error=t.error)  # fmt: skip


def _known(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class Pace:
    """Keeps the spans ended but not yet exported below what MLflow's export pipeline holds.

    Every ended span goes into OTel's BatchSpanProcessor queue, which holds 2,048 spans and
    drops the rest silently; written back to back, a run's traces outrun the exporter thread
    (a 2-core machine lost a third of 1,340 traces). Every `limit` spans the queue and MLflow's
    async write queue are drained (`mlflow.flush_trace_async_logging`) before more are ended.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit, self.pending = limit or SPANS_IN_FLIGHT, 0

    def ended(self) -> None:
        self.pending += 1
        if self.pending >= self.limit:
            mlflow.flush_trace_async_logging()
            self.pending = 0


def write_trace(plan: TracePlan, experiment_id: str, run_id: str, pace: Pace | None = None) -> str:
    """Start and end every span of `plan` with its explicit times; the trace's id. `pace`:
    one shared by the traces written in a row (a trace of its own: one of its own)."""
    metadata = plan.metadata | {SOURCE_RUN_KEY: run_id}
    root = _start(plan.root, None, experiment_id, plan.tags, metadata)
    _emit_children(plan.root, root, experiment_id, pace or Pace())
    return root.trace_id


def _emit_children(node: SpanPlan, span: LiveSpan, experiment_id: str, pace: Pace) -> None:
    for child in node.children:
        _emit_children(child, _start(child, span, experiment_id), experiment_id, pace)
    status = SpanStatus(SpanStatusCode.ERROR, node.error) if node.error else SpanStatusCode.OK
    span.end(outputs=node.outputs, status=status, end_time_ns=node.end_ns)
    pace.ended()


def _start(
    node: SpanPlan,
    parent: LiveSpan | None,
    experiment_id: str,
    tags: dict[str, str] | None = None,
    metadata: dict[str, str] | None = None,
) -> LiveSpan:
    return mlflow.start_span_no_context(
        node.name,
        span_type=node.span_type,
        parent_span=parent,
        inputs=node.inputs,
        attributes=node.attributes,
        tags=tags,
        metadata=metadata,
        experiment_id=experiment_id if parent is None else None,  # a root's only
        start_time_ns=node.start_ns,
    )


def link_app_traces(
    client: MlflowClient, trace_ids: Sequence[str], experiment_id: str, run_id: str
) -> int:
    """Link the app's own traces that are in the run's experiment to the run; how many.

    Ones the store lacks or keeps in another experiment (an app in another process logs to its
    own experiment unless told otherwise) are logged and left out.
    """
    if not trace_ids:
        return 0
    wanted, present = set(trace_ids), []
    token: str | None = None
    while True:
        page = client.search_traces(
            locations=[experiment_id], include_spans=False, max_results=500, page_token=token
        )
        present += [t.info.trace_id for t in page if t.info.trace_id in wanted]
        token = page.token
        if not token:
            break
    for i in range(0, len(present), _LINKS_PER_CALL):
        client.link_traces_to_run(present[i : i + _LINKS_PER_CALL], run_id)
    if missing := len(wanted) - len(present):
        log.warning("%d of the app's MLflow traces are not in experiment %s: not linked to run "
                    "%s", missing, experiment_id, run_id)  # fmt: skip
    return len(present)
