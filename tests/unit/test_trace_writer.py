"""kvscope.trace_writer: traces written in bulk are the traces the fluent API writes, read back
from a real MLflow SQLite store (through MLflow, and as the rows it keeps), and the run's trace
audit stays exact, a failed call's ERROR included."""

import json
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import Span, Trace
from mlflow.tracing.client import TracingClient
from test_mlflow_server import server  # noqa: F401  (a fixture: `mlflow server` on SQLite)
from test_trace_build import PAYLOADS, ROWS, TOOLS
from test_traces import MEASURED, graph_row, open_run, store  # noqa: F401  (store: a fixture)

import kvscope.trace_writer as trace_writer
from kvscope.config import TrackingConfig
from kvscope.probe.tracing import TraceAudit, TrackingRun
from kvscope.records.payloads import PAYLOADS_JSONL, CallPayload
from kvscope.records.requests import to_table
from kvscope.records.tools import TOOLS_JSONL
from kvscope.trace_writer import CLIENT, SQLITE, bulk_path
from kvscope.traces import TraceWrite, write_traces

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
# besides test_trace_build's: a call whose payload MLflow's tracer moves into an attachment
RUN_ROWS = [*ROWS, graph_row("i1", 200, "wf-img", "planner", 1, **MEASURED)]
RUN_PAYLOADS = PAYLOADS | {
    "i1": CallPayload("i1", {"messages": [{"role": "user", "content": [IMAGE]}]}, "seen")
}


@dataclass
class Written:
    write: TraceWrite
    audit: TraceAudit
    traces: dict[str, Trace]  # by workflow.run_id, else root name
    run_id: str


def run_dir(folder: Path) -> Path:
    folder.mkdir()
    (folder / TOOLS_JSONL).write_text("".join(json.dumps(t.to_dict()) + "\n" for t in TOOLS))
    lines = [json.dumps(p.to_dict()) + "\n" for p in RUN_PAYLOADS.values()]
    (folder / PAYLOADS_JSONL).write_text("".join(lines))
    return folder


def write(runs: Path, name: str, rows: list[dict[str, Any]], bulk: bool = True) -> Written:
    run = open_run(runs, name)
    done = write_traces(
        run_dir(runs / name), to_table(rows), client=run.client, experiment_id=run.experiment_id,
        run_id=run.run_id or "", bulk=bulk,
    )  # fmt: skip
    audit = run.finish(done.expected)
    found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
    traces = {}
    for t in found:
        (root,) = [s for s in t.data.spans if s.parent_id is None]
        traces[root.attributes.get("workflow.run_id") or root.name] = t
    return Written(done, audit, traces, run.run_id or "")


@pytest.fixture(scope="module")
def fluent(store: Path) -> Written:  # noqa: F811
    return write(store, "fluent", RUN_ROWS, bulk=False)


@pytest.fixture(scope="module")
def bulk(store: Path) -> Written:  # noqa: F811
    return write(store, "bulk", RUN_ROWS)


def normal(trace: Trace, run_id: str) -> dict[str, Any]:
    """A trace read back without what two writes of it do not share (ids); its spans by their
    path from the root (names and start times)."""
    by_id = {s.span_id: s for s in trace.data.spans}

    def path(span: Span) -> tuple[tuple[str, int], ...]:
        up = by_id.get(span.parent_id) if span.parent_id else None
        return (*(path(up) if up else ()), (span.name, span.start_time_ns))

    spans = {}
    for span in trace.data.spans:
        data = dict(span.to_dict())  # a copy: a stored span hands out its own dict
        for key in ("trace_id", "span_id", "parent_span_id"):
            data.pop(key)
        spans[path(span)] = data
    text = json.dumps({"info": trace.info.to_dict(), "spans": sorted(spans.items())})
    return json.loads(anonymous(text, trace.info.trace_id, run_id))


def anonymous(text: str, trace_id: str, run_id: str) -> str:
    """`text` without the trace's and run's ids and attachments' (random) ids."""
    text = text.replace(trace_id, "TRACE").replace(run_id, "RUN")
    return re.sub(r"mlflow-attachment://[0-9a-f-]+", "mlflow-attachment://ID", text)


def test_bulk_traces_read_back_as_the_fluent_ones(fluent: Written, bulk: Written) -> None:
    assert sorted(bulk.traces) == sorted(fluent.traces) == ["llm", "wf", "wf-img"]
    for name, trace in bulk.traces.items():
        assert normal(trace, bulk.run_id) == normal(fluent.traces[name], fluent.run_id), name
    wf = bulk.traces["wf"]
    assert wf.info.trace_metadata["mlflow.sourceRun"] == bulk.run_id
    assert wf.info.state.value == "ERROR"
    (failed,) = [s for s in wf.data.spans if s.attributes.get("request.uuid") == "r1"]
    status = failed.status
    assert (status.status_code, status.description) == ("ERROR", "engine returned 500")
    tool = next(s for s in wf.data.spans if s.name == "lookup")
    assert tool.outputs == {"rows": [1, 2]}  # a JSON text output, as the store translates it
    assert wf.info.trace_metadata["mlflow.trace.cost"]  # the priced call, summed


def rows(db: Path, trace_id: str, run_id: str) -> dict[str, Any]:
    """What the store keeps of a trace, but the ids and db_payload_generation (a write counter:
    the fluent path bumps it per span batch)."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        info = dict(con.execute("SELECT * FROM trace_info WHERE request_id = ?", (trace_id,))
                    .fetchone())  # fmt: skip
        del info["request_id"], info["db_payload_generation"]
        tags = dict(con.execute("SELECT key, value FROM trace_tags WHERE request_id = ?",
                                (trace_id,)).fetchall())  # fmt: skip
        metadata = dict(con.execute(
            "SELECT key, value FROM trace_request_metadata WHERE request_id = ?", (trace_id,)
        ).fetchall())  # fmt: skip
        spans = []
        for s in con.execute("SELECT * FROM spans WHERE trace_id = ?", (trace_id,)):
            span = dict(s)
            content = json.loads(span.pop("content"))
            for key in ("trace_id", "span_id", "parent_span_id"):
                span.pop(key)
                content.pop(key)
            spans.append(json.dumps([span, content], sort_keys=True))
    finally:
        con.close()
    return json.loads(anonymous(json.dumps([info, tags, metadata, sorted(spans)]), trace_id,
                                run_id))  # fmt: skip


def test_bulk_rows_are_the_rows_the_store_keeps_for_fluent_traces(
    store: Path,  # noqa: F811
    fluent: Written,
    bulk: Written,
) -> None:
    db = store / "mlflow.db"
    for name, trace in bulk.traces.items():
        ours = rows(db, trace.info.trace_id, bulk.run_id)
        theirs = rows(db, fluent.traces[name].info.trace_id, fluent.run_id)
        assert ours == theirs, name


def test_the_count_audit_stays_exact(fluent: Written, bulk: Written) -> None:
    for written in (fluent, bulk):
        assert written.write == TraceWrite(written=3, app_linked=0)
        assert written.audit == TraceAudit(expected=3, written=3, dropped=0, incomplete=0)


def many(count: int) -> list[dict[str, Any]]:
    return [graph_row(f"w{w}-{i}", w * 50 + i * 10, f"wf-{w}", agent, 1, **MEASURED)
            for w in range(count) for i, agent in enumerate(("planner", "executor"))]  # fmt: skip


def test_chunks_of_many_traces_are_all_written(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace_writer, "CHUNK", 40)
    written = write(store, "chunks", many(250))
    assert written.audit == TraceAudit(expected=250, written=250, dropped=0, incomplete=0)


def test_a_failed_insert_goes_through_mlflows_store_api(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("no such column")

    monkeypatch.setattr(trace_writer, "insert_sqlite", broken)
    written = write(store, "api", RUN_ROWS)
    assert written.audit == TraceAudit(expected=3, written=3, dropped=0, incomplete=0)
    assert "inserting into" in caplog.text and "no such column" in caplog.text


def test_an_insert_failing_mid_run_loses_nothing(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The second chunk's insert fails: it and the rest go through MLflow's store API, every
    trace written once."""
    inserted: list[int] = []
    real = trace_writer.insert_sqlite

    def flaky(store: Any, experiment: Any, traces: Any) -> None:
        inserted.append(len(traces))
        if len(inserted) == 2:
            raise RuntimeError("database is locked")
        real(store, experiment, traces)

    monkeypatch.setattr(trace_writer, "CHUNK", 40)
    monkeypatch.setattr(trace_writer, "insert_sqlite", flaky)
    written = write(store, "flaky", many(100))
    assert written.audit == TraceAudit(expected=100, written=100, dropped=0, incomplete=0)
    assert inserted == [40, 40]  # the third chunk: through the store API
    assert "database is locked" in caplog.text


def test_through_mlflows_store_api_the_traces_are_the_fluent_ones(
    store: Path,  # noqa: F811
    fluent: Written,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace_writer, "bulk_path", lambda *_: CLIENT)
    written = write(store, "client", RUN_ROWS)
    assert written.audit == TraceAudit(expected=3, written=3, dropped=0, incomplete=0)
    for name, trace in written.traces.items():
        assert normal(trace, written.run_id) == normal(fluent.traces[name], fluent.run_id), name


def test_a_store_that_logs_no_spans_gets_the_fluent_writer(
    store: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: Any) -> None:
        raise NotImplementedError

    monkeypatch.setattr(trace_writer, "bulk_path", lambda *_: CLIENT)
    monkeypatch.setattr(TracingClient, "log_spans", refuse)
    written = write(store, "refused", RUN_ROWS)
    assert written.audit == TraceAudit(expected=3, written=3, dropped=0, incomplete=0)


@pytest.mark.parametrize(
    "err",
    [NotImplementedError("log_spans is not supported: MLflow server version 3.3.0 < 3.4"),
     RuntimeError("REST OTLP span logging is not supported by FileStore")],
)  # fmt: skip
def test_what_says_a_store_logs_no_spans(err: Exception) -> None:
    assert trace_writer.logs_no_spans(err)
    assert not trace_writer.logs_no_spans(RuntimeError("database is locked"))


def test_bulk_path_by_store(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    uri = f"sqlite:///{store / 'mlflow.db'}"
    sql = TracingClient(uri).store
    assert bulk_path(sql, uri) == SQLITE
    monkeypatch.setenv("MLFLOW_SQL_TRACE_ROLLUPS_ENABLED", "true")
    assert bulk_path(sql, uri) == CLIENT
    assert bulk_path(object(), "file:///tmp/mlruns") is None


def test_to_a_tracking_server_the_traces_are_the_fluent_ones(
    server: tuple[str, Path],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through a real `mlflow server` (OTLP span requests, REST trace infos)."""
    uri, _ = server
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # TrackingRun.open exports it
    written = {}
    for name, bulk in (("fluent", False), ("bulk", True)):
        run = TrackingRun.open(TrackingConfig(tracking_uri=uri, experiment="remote"), tmp_path)
        run.start(name, {}, {})
        done = write_traces(
            run_dir(tmp_path / name), to_table(RUN_ROWS), client=run.client,
            experiment_id=run.experiment_id, run_id=run.run_id or "", bulk=bulk,
        )  # fmt: skip
        audit = run.finish(done.expected)
        assert audit == TraceAudit(expected=3, written=3, dropped=0, incomplete=0)
        found = run.client.search_traces(locations=[run.experiment_id], run_id=run.run_id)
        written[name] = {t.info.tags["mlflow.traceName"] + str(t.info.request_time):
                         normal(t, run.run_id or "") for t in found}  # fmt: skip
    assert written["bulk"] == written["fluent"]
