"""A run's MLflow traces written by a child process while publish renders the run's files.

    job = TraceJob.start(run_dir, tracking_uri, experiment_id, run_id)   # None: not started
    job = TraceJob.start(..., go=False); finalize(...); job.go()    # imports paid meanwhile
    ...                                       # summary.json, figures, report.html meanwhile
    done = job.wait()                         # TraceWrite; None: write them in this process

Publish's other work (figures, report: matplotlib, pure Python) and the traces (plan, build,
insert: pure Python and SQLite) each keep one core busy; a thread would share the GIL, a child
process runs beside it. The child (`python -m kvscope.trace_job`, a fresh interpreter: no fork
of a process holding MLflow's and pyarrow's threads) reads the run's streams (payloads, tools:
while the table is finalized), then the finalized requests.parquet, writes as
`kvscope.traces.write_traces` does, drains MLflow's queue (traces written the fluent way) and
leaves its TraceWrite as JSON in a result file.

`wait` answers None only where the child wrote nothing (it failed before its first write: the
caller writes the traces itself, none twice). A child that fails after it began writing is not
rerun: `wait` answers the traces it was to write (its plans, counted before writing) so the
run's audit counts what is missing as dropped, and says why in the log.
"""

import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvscope.probe.child import CAPTURE_ENV

if TYPE_CHECKING:
    from kvscope.traces import TraceWrite

log = logging.getLogger(__name__)

RESULT = ".traces.json"  # in the run directory while the job runs: its TraceWrite
PLANNED = ".traces.planned"  # written before the first trace: how many it was to write
GO = b"go\n"  # the parent's word on the child's stdin: the finalized table is written


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

        mlflow.flush_trace_async_logging()
        for name in (RESULT, PLANNED):
            (run_dir / name).unlink(missing_ok=True)
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
        except OSError:  # the child is gone already: wait() says what it left
            pass

    def cancel(self) -> None:
        """Stop the child (publish failed before it waited for it)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()

    def wait(self) -> "TraceWrite | None":
        """The child's TraceWrite once it exits; None where it wrote nothing (see the module)."""
        from kvscope.traces import TraceWrite

        try:
            _, err = self.process.communicate()
        finally:  # interrupted: the child goes too
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        result, planned = self.run_dir / RESULT, self.run_dir / PLANNED
        try:
            if self.process.returncode == 0 and result.exists():
                return TraceWrite(**json.loads(result.read_text()))
            why = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            if not planned.exists():
                log.warning("MLflow traces: the child process failed before writing (exit %s: "
                            "%s); writing them here", self.process.returncode, why[0])  # fmt: skip
                return None
            log.warning("MLflow traces: the child process failed while writing (exit %s: "
                        "%s); the run's audit counts what it did not write",
                        self.process.returncode, why[0])  # fmt: skip
            return TraceWrite(int(planned.read_text()), 0)
        finally:
            for path in (result, planned):
                path.unlink(missing_ok=True)


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

    def planned(count: int) -> None:
        (run_dir / PLANNED).write_text(str(count))

    done = write_traces(run_dir, table, client=MlflowClient(uri), experiment_id=experiment_id,
                        run_id=run_id, on_planned=planned, streams=streams)  # fmt: skip
    mlflow.flush_trace_async_logging()
    (run_dir / RESULT).write_text(json.dumps(asdict(done)))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
