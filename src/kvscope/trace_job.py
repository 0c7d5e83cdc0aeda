"""A run's MLflow traces written by a child process while publish renders the run's files, and
by publish itself once its report is written.

    job = TraceJob.start(run_dir, tracking_uri, experiment_id, run_id)   # None: not started
    job = TraceJob.start(..., go=False); finalize(...); job.go()    # imports paid meanwhile
    ...                                       # summary.json, figures, report.html meanwhile
    done = job.share(requests, write)         # TraceWrite: the child's and publish's

Publish's other work (figures, report: matplotlib, pure Python) and the traces (plan, build,
insert: pure Python and SQLite) each keep a core busy; a thread would share the GIL, a child
process runs beside it (`python -m kvscope.trace_job`, a fresh interpreter: no fork of a
process holding MLflow's and pyarrow's threads). It reads the run's streams (payloads, tools:
while the table is finalized), then the finalized requests.parquet.

The traces are cut into SLICES by time (`slice_rows`: each trace in one slice, the slices of
about equal count, in time order). The child writes them from the first on; publish, once its
report is written (its core free), from the last on, until the two meet: each slice is claimed
by creating its claim file (`O_EXCL`: by one writer only), which then holds how many traces its
writer planned in it (written before its first trace). A 100k-call run's traces take the child
longer than the analysis, figures and report take publish: the core publish would spend waiting
writes the last slices instead. Each writer writes its slices in time order (their trace ids
ascend: the store's indexes take them in key order).

A child that fails is not rerun: the slices it claimed and planned count as written (their
plans, counted before writing), so the run's audit counts what is missing as dropped and the
log says why; a slice it claimed but never planned (nothing of it written) is written by
publish, as are the slices it never claimed.
"""

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from kvscope.traces import TraceWrite

log = logging.getLogger(__name__)

RESULT = ".traces.json"  # in the run directory while the job runs: the child's TraceWrite
CLAIM = ".traces.claim."  # + a slice's index: claimed; its content, once planned: its count
GO = b"go\n"  # the parent's word on the child's stdin: the finalized table is written
SLICES = 16  # a slice of a 100k-call run: ~1,600 traces, ~1.2 s of a core

# Writes a table's traces; the callable it is given hears how many before the first is written.
Write = Callable[["pa.Table", Callable[[int], None]], "TraceWrite"]


def slice_rows(requests: "pa.Table", slices: int = SLICES) -> "pa.Array":
    """Each row's slice: its trace's (an invocation's rows by workflow_run_id, a graph-less
    call by its request_uuid) rank by first start, times `slices`, over the count of traces."""
    import pyarrow as pa

    uuids = requests.column("request_uuid").to_pylist()
    runs = requests.column("workflow_run_id").to_pylist()
    keys = [r if r is not None else u for r, u in zip(runs, uuids, strict=True)]
    first: dict[str, int] = {}
    for key, start in zip(keys, requests.column("start_ns").to_pylist(), strict=True):
        if key not in first or start < first[key]:
            first[key] = start
    order = sorted(first, key=lambda k: (first[k], k))
    rank = {k: i * slices // len(order) for i, k in enumerate(order)}
    return pa.array([rank[k] for k in keys], pa.int32())


def write_slices(
    run_dir: Path, requests: "pa.Table", write: Write, order: Iterable[int]
) -> tuple["TraceWrite", list[int]]:
    """Claim and write the slices of `order` until one is claimed already; what was written,
    and the slices claimed."""
    import pyarrow.compute as pc

    from kvscope.traces import TraceWrite

    index, done, taken = slice_rows(requests), TraceWrite(0, 0), []
    for k in order:
        if not _claim(run_dir, k):
            break
        taken.append(k)
        rows = requests.filter(pc.equal(index, k))
        planned = _path(run_dir, k).write_text
        if rows.num_rows == 0:
            planned("0")
            continue
        done += write(rows, lambda count, planned=planned: planned(str(count)))  # type: ignore[misc]
    return done, taken


def _path(run_dir: Path, k: int) -> Path:
    return run_dir / f"{CLAIM}{k}"


def _claim(run_dir: Path, k: int) -> bool:
    try:
        os.close(os.open(_path(run_dir, k), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _clean(run_dir: Path) -> None:
    for path in [run_dir / RESULT, *run_dir.glob(f"{CLAIM}*")]:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class TraceJob:
    process: subprocess.Popen[bytes]
    run_dir: Path

    @classmethod
    def start(
        cls, run_dir: Path, tracking_uri: str, experiment_id: str, run_id: str, go: bool = True
    ) -> "TraceJob | None":
        """The child started on the run directory's finalized table; None where it cannot be.
        MLflow's trace queue in this process is drained first (an app's own traces: in the
        store before the child links them, and no writer of this process beside the child's).
        `go=False`: the child imports what it needs (MLflow: ~2-3 s) and waits for `go()`
        before it reads the table (the table being written meanwhile); never told, it exits
        having written nothing."""
        import mlflow

        # here, not at the module's top: the child's interpreter would pay ~1 s of imports
        from kvscope.probe.child import CAPTURE_ENV

        mlflow.flush_trace_async_logging()
        _clean(run_dir)
        argv = [sys.executable, "-m", "kvscope.trace_job", str(run_dir), tracking_uri,
                experiment_id, run_id]  # fmt: skip
        # never a profiled program's process: no probe attached at its start (probe/child.py)
        env = {k: v for k, v in os.environ.items() if k != CAPTURE_ENV}
        try:
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, env=env)  # fmt: skip
        except OSError as err:
            log.warning("MLflow traces: no child process (%s); writing them here", err)
            return None
        job = cls(process, run_dir)
        if go:
            job.go()
        return job

    def go(self) -> None:
        """Tell the child the table is there: it writes the traces now."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(GO)
            self.process.stdin.flush()
        except OSError:  # the child is gone already: share() says what it left
            pass

    def cancel(self) -> None:
        """Stop the child (publish failed before it shared the traces)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()
        _clean(self.run_dir)

    def share(self, requests: "pa.Table", write: Write) -> "TraceWrite":
        """Write the slices the child has not claimed, from the last on, wait for the child,
        write what it claimed and left unplanned; every trace's write, the child's and ours."""
        from kvscope.traces import TraceWrite

        try:
            mine, taken = write_slices(self.run_dir, requests, write, reversed(range(SLICES)))
            theirs = self._wait()
            if theirs is None:  # failed: what it planned counts, what it did not is written here
                counts = {k: _path(self.run_dir, k).read_text() for k in range(SLICES)
                          if k not in taken and _path(self.run_dir, k).exists()}  # fmt: skip
                theirs = TraceWrite(sum(int(c) for c in counts.values() if c), 0)
                left = [k for k, c in counts.items() if not c]
                for k in left:
                    _path(self.run_dir, k).unlink()
                mine += write_slices(self.run_dir, requests, write, left)[0]
        finally:
            if self.process.poll() is None:  # interrupted: the child goes too
                self.process.kill()
                self.process.wait()
            _clean(self.run_dir)
        return mine + theirs

    def _wait(self) -> "TraceWrite | None":
        """The child's TraceWrite once it exits; None where it failed."""
        from kvscope.traces import TraceWrite

        _, err = self.process.communicate()
        result = self.run_dir / RESULT
        if self.process.returncode == 0:  # without a result: never told to go, claimed nothing
            return TraceWrite(**json.loads(result.read_text())) if result.exists() else (
                TraceWrite(0, 0))  # fmt: skip
        why = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        log.warning("MLflow traces: the child process failed (exit %s: %s); of the traces it "
                    "claimed, those it did not write count as dropped, those it did not plan "
                    "are written here", self.process.returncode, why[0])  # fmt: skip
        return None


def main(argv: list[str]) -> int:
    """python -m kvscope.trace_job RUN_DIR TRACKING_URI EXPERIMENT_ID RUN_ID"""
    import mlflow
    from mlflow import MlflowClient

    from kvscope.records.run_dir import RunDir
    from kvscope.traces import Streams, write_traces

    run_dir, uri, experiment_id, run_id = Path(argv[0]), argv[1], argv[2], argv[3]
    streams = Streams.load(run_dir)  # written during the run: read while the table is made
    if sys.stdin.buffer.readline() != GO:  # never told: the parent went on without traces
        return 0
    mlflow.set_tracking_uri(uri)  # the fluent writer's traces, where any
    table = RunDir.open(run_dir).requests
    client = MlflowClient(uri)

    def write(rows: "pa.Table", planned: Callable[[int], None]) -> "TraceWrite":
        return write_traces(run_dir, rows, client=client, experiment_id=experiment_id,
                            run_id=run_id, on_planned=planned, streams=streams)  # fmt: skip

    done, _ = write_slices(run_dir, table, write, range(SLICES))
    mlflow.flush_trace_async_logging()
    (run_dir / RESULT).write_text(json.dumps(asdict(done)))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
