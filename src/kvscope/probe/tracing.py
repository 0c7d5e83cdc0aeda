"""MLflow side of a run: one MLflow run per configuration (`TrackingRun`) and its trace audit.

The traces themselves (one per graph invocation) are written at publish from the run's streams
(kvscope/traces.py), or are the app's own (autolog), annotated live (probe/app_spans.py).

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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import mlflow
from mlflow import MlflowClient
from mlflow.entities import (
    Metric,
    Param,
    RunTag,
    Trace,
)
from mlflow.entities.entity_type import EntityAssociationType
from mlflow.store.tracking.dbmodels.models import (
    SqlEntityAssociation,
    SqlSpan,
    SqlTraceInfo,
    SqlTraceMetadata,
)
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracing.constant import TraceMetadataKey
from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import aliased

from kvscope.config import TrackingConfig
from kvscope.probe.mlflow_store import TraceAudit, local_store_uri
from kvscope.probe.mlflow_store import unreachable as unreachable  # re-exported: its old home

log = logging.getLogger(__name__)

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

    def start(
        self,
        run_name: str,
        params: dict[str, object],
        tags: dict[str, str],
        start_time_ms: int | None = None,
    ) -> str:
        """Start (and make active) the run; traces started from now on link to it.
        `start_time_ms`: when the run began, where that was earlier than now (a session that
        opened its MLflow run at its close)."""
        if start_time_ms is None:
            run = mlflow.start_run(experiment_id=self.experiment_id, run_name=run_name, tags=tags)
        else:
            made = self.client.create_run(self.experiment_id, start_time_ms, tags, run_name)
            run = mlflow.start_run(run_id=made.info.run_id)
        self.run_id = run.info.run_id
        self.log_params(params)
        return self.run_id

    def log_params(self, params: Mapping[str, object]) -> None:
        """Params of the run, each value cut to MLflow's limit, 100 a batch."""
        run_id = self._run()
        items = [Param(k, truncate_param(str(v))) for k, v in params.items()]
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[i : i + _PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, float | None]) -> None:
        """Run-level summaries (logged once, step 0); an unmeasured (None) value is not logged."""
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None]
        self.client.log_batch(self._run(), metrics=batch)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.client.log_batch(self._run(), tags=[RunTag(k, v) for k, v in tags.items()])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self._run(), str(path), artifact_path)

    def log_dict(self, obj: dict[str, Any], name: str) -> None:
        """`obj` as JSON (or YAML, by the name's suffix) at artifact path `name`."""
        self.client.log_dict(self._run(), obj, name)

    def end(self, status: str) -> None:
        """End the run without the traces' audit (a run that could not be concluded)."""
        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            mlflow.end_run(status=status)
        else:
            self.client.set_terminated(self._run(), status=status)

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

        The run's traces are those `search_traces(run_id=...)` finds in the experiment: the
        ones whose `mlflow.sourceRun` is the run and the ones linked to it. Against a database
        store (kvscope's local SQLite) one query counts each one's span rows
        (`sql_span_counts`: 25,000 traces in well under a second), and only a trace with fewer
        rows than its `num_spans` is loaded (`get_trace`: its spans may be in the artifact
        store) and judged by what loads; against a tracking server every trace is loaded with
        its spans, a page at a time (2-3 ms a trace).
        """
        run_id = self._run()
        store = _store(self.client)
        if isinstance(store, SqlAlchemyStore):
            counted = sql_span_counts(store, self.experiment_id, run_id)
            short = [i for i, (stats, rows) in counted.items() if rows < _num_spans(stats)]
            linked = len(counted)
            written = linked - len(short) + sum(map(self._loads_complete, short))
        else:
            linked = sum(1 for _ in self._search(run_id, include_spans=False))
            written = sum(map(trace_complete, self._search(run_id, include_spans=True)))
        dropped = max(expected_traces - written, 0)
        return TraceAudit(expected_traces, written, dropped, max(linked - written, 0))

    def _loads_complete(self, trace_id: str) -> bool:
        """Whether the trace loads with all its spans (from wherever the store keeps them)."""
        try:
            return trace_complete(self.client.get_trace(trace_id))
        except Exception:  # MLflow's: not found, spans missing, an artifact store failing
            return False

    def _search(self, run_id: str, include_spans: bool) -> Iterator[Trace]:
        """The run's traces, a page of 500 at a time: a 10,000-trace run held at once with its
        spans took ~1 GiB."""
        token: str | None = None
        while True:
            page = self.client.search_traces(
                locations=[self.experiment_id],
                run_id=run_id,
                include_spans=include_spans,
                max_results=500,
                page_token=token,
            )
            yield from page
            token = page.token
            if not token:
                return

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


def trace_complete(trace: Trace) -> bool:
    return len(trace.data.spans) >= _num_spans(trace.info.trace_metadata.get(SIZE_STATS_KEY))


def _store(client: MlflowClient) -> object:
    """The store behind an MlflowClient (MLflow has no public accessor); None for another
    client (a test's stand-in)."""
    return getattr(getattr(client, "_tracking_client", None), "store", None)


def _num_spans(size_stats: str | None) -> int:
    """The spans a trace should have, from its `sizeStats` metadata (1 where it has none)."""
    return int(json.loads(size_stats or "{}").get("num_spans", 1))


def sql_span_counts(
    store: SqlAlchemyStore, experiment_id: str, run_id: str
) -> dict[str, tuple[str | None, int]]:
    """The run's traces in a database store, as `search_traces(locations=[experiment_id],
    run_id=run_id)` selects them (metadata `mlflow.sourceRun` is the run, or linked to it):
    trace id -> (its `sizeStats` metadata, the span rows it has), in one query."""
    info, meta = SqlTraceInfo, SqlTraceMetadata
    stats = aliased(SqlTraceMetadata)
    linked = exists().where(
        SqlEntityAssociation.source_id == info.request_id,
        SqlEntityAssociation.source_type == EntityAssociationType.TRACE,
        SqlEntityAssociation.destination_type == EntityAssociationType.RUN,
        SqlEntityAssociation.destination_id == run_id,
    )
    source = exists().where(
        meta.request_id == info.request_id,
        meta.key == TraceMetadataKey.SOURCE_RUN,
        meta.value == run_id,
    )
    rows = select(func.count()).where(SqlSpan.trace_id == info.request_id).scalar_subquery()
    query = (
        select(info.request_id, stats.value, rows)
        .outerjoin(stats, (stats.request_id == info.request_id) & (stats.key == SIZE_STATS_KEY))
        .where(info.experiment_id == int(experiment_id), or_(linked, source))
    )
    with store.ManagedSessionMaker() as session:
        return {trace_id: (value, n) for trace_id, value, n in session.execute(query)}
