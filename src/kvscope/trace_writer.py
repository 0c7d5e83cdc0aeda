"""A run's MLflow traces written in bulk: many traces per store operation, nothing queued.

`write_bulk` builds each planned trace (trace_build.py) and writes them CHUNK at a time, by the
store behind the tracking URI:
- kvscope's local store (SQLite, `sqlite:///<runs>/mlflow.db`): one transaction per chunk,
  the rows MLflow's SqlAlchemyStore.start_trace and log_spans would leave (`insert_sqlite`; its
  docstring says why not through them);
- a tracking server (`http(s)://`) or another SQL database: MLflow's own store API through its
  `TracingClient`, as MLflow's exporter calls it: one `log_spans` per chunk (to a server, one
  OTLP request), then `start_trace` for each trace (to a server, several requests at once);
- a store that logs no spans (a file store, Databricks): nothing; the caller writes those the
  fluent way, as it does a trace whose values need MLflow's tracer (trace_build.py).
The fluent API writes one span at a time through OpenTelemetry's export queue (2,048 spans,
dropping the rest) and MLflow's async queue; here each write returns when stored, so nothing is
dropped for speed. The run's audit (probe/tracing.py) still reads back what reached the store.
"""

import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlflow.entities import Experiment, Span
from mlflow.store.tracking.dbmodels.models import (
    SqlSpan,
    SqlTraceInfo,
    SqlTraceMetadata,
    SqlTraceTag,
)
from mlflow.store.tracking.rest_store import RestStore
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.store.tracking.utils.sql_trace_rollups import rollups_enabled
from mlflow.store.tracking.utils.trace_analytics import (
    COST_COLUMN_BY_KEY,
    PROMOTED_TRACE_METADATA_KEYS,
    TOKEN_COLUMN_BY_KEY,
    analytics_columns_from_metadata,
    bounded_model_dimension,
    finite_float_or_none,
    validate_session_id,
    validate_trace_name,
)
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import SpansLocation, TraceMetadataKey, TraceTagKey
from mlflow.utils.mlflow_tags import MLFLOW_ARTIFACT_LOCATION
from mlflow.utils.uri import append_to_uri_path, is_databricks_uri

from kvscope.trace_build import BuiltTrace, TracePlan, build_trace, environment_metadata

log = logging.getLogger(__name__)

CHUNK = 500  # traces per transaction (~5,000 spans, ~15 MB of span JSON at most in memory)
SERVER_CHUNK = 100  # traces per OTLP request to a tracking server
SERVER_REQUESTS = 8  # start_trace requests to a server at once
SQLITE, CLIENT = "sqlite", "client"
_SESSION_ATTRIBUTES = ("session.id", "gen_ai.conversation.id")  # log_spans' session source
_ANALYTICS = ["session_id", *TOKEN_COLUMN_BY_KEY.values(), *COST_COLUMN_BY_KEY.values()]


def bulk_path(store: Any, tracking_uri: str) -> str | None:
    """How `store` takes traces in bulk: SQLITE (kvscope's local store: rows inserted), CLIENT
    (MLflow's store API: a server, another database) or None (the fluent way only)."""
    if type(store) is SqlAlchemyStore and store.db_type == "sqlite" and not rollups_enabled():
        return SQLITE  # a subclass may scope writes (workspaces); rollups need their queue
    if isinstance(store, SqlAlchemyStore | RestStore) and not is_databricks_uri(tracking_uri):
        return CLIENT
    return None


def write_bulk(
    plans: Sequence[TracePlan], tracking_uri: str, experiment_id: str, run_id: str
) -> list[TracePlan]:
    """Write the traces of `plans`, linked to `run_id`; the plans left to write the fluent
    way (the store takes no bulk writes, or a trace's values need MLflow's tracer).

    A chunk is built, then written, in this thread: inserting on a second thread while the next
    chunk was built took longer (10,000 traces: 11.2 s, not 10.0 s; the inserting thread waited
    for the GIL after each row SQLite stored). A chunk that fails is logged and not retried
    (the run's audit counts it as dropped); where inserting into SQLite fails, that chunk and
    the rest go through MLflow's store API."""
    client = TracingClient(tracking_uri)
    path = bulk_path(client.store, tracking_uri)
    if path is None:
        return list(plans)
    env = environment_metadata()
    experiment = client.store.get_experiment(experiment_id)
    left: list[TracePlan] = []
    size = CHUNK if path == SQLITE else SERVER_CHUNK
    for start in range(0, len(plans), size):
        before = len(left)
        built = _build(plans[start : start + size], experiment_id, run_id, env, left)
        if path == SQLITE:
            try:
                insert_sqlite(client.store, experiment, built)
                continue
            except Exception as err:  # a newer MLflow's schema, a locked database: its API
                log.warning("MLflow traces: inserting into %s failed (%s: %s); writing "
                            "through MLflow's store API", tracking_uri, type(err).__name__,
                            err)  # fmt: skip
                path = CLIENT
        if not _log(client, experiment_id, built):
            return left[:before] + list(plans[start:])
    return left


def _build(
    plans: Sequence[TracePlan], experiment_id: str, run_id: str, env: dict[str, str],
    left: list[TracePlan],
) -> list[BuiltTrace]:  # fmt: skip
    """The traces of `plans` built; the plans that cannot be added to `left`."""
    built = []
    for plan in plans:
        trace = build_trace(plan, experiment_id, run_id, env)
        if trace is None:
            left.append(plan)
        else:
            built.append(trace)
    return built


def _log(client: TracingClient, experiment_id: str, built: Sequence[BuiltTrace]) -> bool:
    """`log_traces`; False where the store logs no spans (nothing of the chunk written: it and
    the rest are for the fluent way); another failure is logged (the audit counts it)."""
    try:
        log_traces(client, experiment_id, built)
    except Exception as err:
        if logs_no_spans(err):
            return False
        log.warning("MLflow traces: %d not written (%s: %s); the run's audit counts them",
                    len(built), type(err).__name__, err)  # fmt: skip
    return True


def logs_no_spans(err: Exception) -> bool:
    """Whether `err` says the store logs no spans, as MLflow's exporter reads it: a store
    without `log_spans`, a server older than 3.4, a server whose backend is a file store."""
    return isinstance(err, NotImplementedError) or "OTLP span logging is not supported" in str(
        err)  # fmt: skip


def log_traces(client: TracingClient, experiment_id: str, traces: Sequence[BuiltTrace]) -> None:
    """Through MLflow's store API, in the order its exporter uses: the spans of all `traces`
    (one `log_spans`: a server's OTLP endpoint, a database's transaction), then each trace's
    info (`start_trace`, which adds the metadata: the source run, size stats)."""
    if not traces:
        return
    spans = [Span.from_dict(s) for t in traces for s in t.spans]
    client.log_spans(experiment_id, spans)
    workers = SERVER_REQUESTS if isinstance(client.store, RestStore) else 1
    failed = _each(client.start_trace, [t.info for t in traces], workers)
    if failed:
        log.warning("MLflow traces: %d of %d trace infos not written (%s)", len(failed),
                    len(traces), failed[0])  # fmt: skip


def _each(call: Callable[[Any], object], items: list[Any], workers: int) -> list[str]:
    """`call` on each item (`workers` at once); the failures, as text."""

    def one(item: Any) -> str | None:
        try:
            call(item)
        except Exception as err:
            return f"{type(err).__name__}: {err}"
        return None

    if workers == 1:
        results = [one(i) for i in items]
    else:
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(one, items))
    return [r for r in results if r is not None]


def insert_sqlite(
    store: SqlAlchemyStore, experiment: Experiment, traces: Sequence[BuiltTrace]
) -> None:
    """Insert `traces` into the SQLite store in one transaction, as the rows
    `SqlAlchemyStore.start_trace` and then `log_spans` leave for a new trace (MLflow 3.17):
    trace_info with its analytics columns (trace name, session, token usage, cost, previews of
    the root's inputs and outputs), trace_tags (the trace's, its artifact location, where its
    spans are), trace_request_metadata (the rest, and `mlflow.trace.infoFinalized`) and spans
    (each one's JSON, as translated for storing: trace_build.py).

    Why not the store's own methods: start_trace is a transaction of its own (a synced commit)
    per trace, and log_spans parses every attribute of every span again and has SQLAlchemy
    compile a multi-row INSERT per 100 spans; through them a 10-span trace took about as long
    as the fluent path's (bench/traces_publish.py, its `api` writer). Here a chunk costs one
    commit and plain executemany inserts. What the store's methods do besides is left out:
    rollups (only when MLFLOW_SQL_TRACE_ROLLUPS_ENABLED, then `bulk_path` does not choose
    this) and the user id (`user.id`, never set by kvscope).
    """
    rows: dict[str, list[tuple[Any, ...]]] = {table: [] for table in _COLUMNS}
    experiment_id = int(experiment.experiment_id)
    for trace in traces:
        info, trace_id = trace.info, trace.info.trace_id
        each = zip(trace.spans, trace.contents, trace.keys, strict=True)
        columns = dict.fromkeys(_ANALYTICS) | analytics_columns_from_metadata(info.trace_metadata)
        if columns["session_id"] is None:
            columns["session_id"] = _span_session(trace)
        for key, column in COST_COLUMN_BY_KEY.items():  # log_spans' sum of the spans' costs
            columns[column] = finite_float_or_none((trace.cost or {}).get(key))
        rows[SqlTraceInfo.__tablename__].append((
            trace_id, experiment_id, info.request_time, info.execution_duration,
            info.state.value, info.client_request_id, info.request_preview,
            info.response_preview, 1, validate_trace_name(info.tags.get(TraceTagKey.TRACE_NAME)),
            *(columns[c] for c in _ANALYTICS),
        ))  # fmt: skip
        location = append_to_uri_path(experiment.artifact_location,
                                      SqlAlchemyStore.TRACE_FOLDER_NAME, trace_id,
                                      SqlAlchemyStore.ARTIFACTS_FOLDER_NAME)  # fmt: skip
        tags = {k: v for k, v in info.tags.items() if k != TraceTagKey.TRACE_NAME}
        tags |= {MLFLOW_ARTIFACT_LOCATION: location,
                 TraceTagKey.SPANS_LOCATION: SpansLocation.TRACKING_STORE.value}  # fmt: skip
        rows[SqlTraceTag.__tablename__] += [(trace_id, k, v) for k, v in tags.items()]
        kept = {k: v for k, v in info.trace_metadata.items()
                if k not in PROMOTED_TRACE_METADATA_KEYS}  # fmt: skip
        kept[TraceMetadataKey.TRACE_INFO_FINALIZED] = "true"
        rows[SqlTraceMetadata.__tablename__] += [(trace_id, k, v) for k, v in kept.items()]
        rows[SqlSpan.__tablename__] += [(
            trace_id, experiment_id, key.span_id, key.parent_id, span["name"], key.span_type,
            key.status, span["start_time_unix_nano"], span["end_time_unix_nano"], content,
            *(finite_float_or_none((key.cost or {}).get(k)) for k in COST_COLUMN_BY_KEY),
            bounded_model_dimension(key.model), None,
        ) for span, content, key in each]  # fmt: skip
    if not traces:
        return
    with store.ManagedSessionMaker(read_only=False) as session:
        connection = session.connection()
        for table, columns in _COLUMNS.items():  # parents first: the foreign keys are checked
            marks = ", ".join("?" * len(columns))
            sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
            # in primary-key order (the trace id first): the inserts took 10-30% less time
            connection.exec_driver_sql(sql, sorted(rows[table]))


# The columns insert_sqlite sets, in its rows' order (duration_ns is computed by the database).
_COLUMNS = {
    SqlTraceInfo.__tablename__: (
        "request_id", "experiment_id", "timestamp_ms", "execution_time_ms", "status",
        "client_request_id", "request_preview", "response_preview", "db_payload_generation",
        "trace_name", *_ANALYTICS,
    ),
    SqlTraceTag.__tablename__: ("request_id", "key", "value"),
    SqlTraceMetadata.__tablename__: ("request_id", "key", "value"),
    SqlSpan.__tablename__: (
        "trace_id", "experiment_id", "span_id", "parent_span_id", "name", "type", "status",
        "start_time_unix_nano", "end_time_unix_nano", "content", "input_cost", "output_cost",
        "total_cost", "model_name", "model_provider",
    ),
}  # fmt: skip


def _span_session(trace: BuiltTrace) -> str | None:
    """log_spans' session of a trace without one in its metadata: the first span's
    `session.id` or `gen_ai.conversation.id` (the JSON of a string: that string)."""
    for span in trace.spans:
        for name in _SESSION_ATTRIBUTES:
            if value := span["attributes"].get(name):
                try:
                    parsed = json.loads(value)
                except ValueError:
                    parsed = None
                return validate_session_id(parsed if isinstance(parsed, str) else value)
    return None
