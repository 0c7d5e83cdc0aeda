"""A run's MLflow traces written by child processes while publish renders the run's files.

    job = TraceJob.start(run_dir, tracking_uri, experiment_id, run_id)   # None: not started
    job = TraceJob.start(..., go=False); finalize(...); job.go()    # imports paid meanwhile
    ...                                       # summary.json, figures, report.html meanwhile
    done, left = job.wait()                   # TraceWrite; `left`: the parts to write here

Publish's other work (figures, report: matplotlib, pure Python) and the traces (plan, build,
insert: pure Python and SQLite) each keep a core busy; a thread would share the GIL, a child
process runs beside it. A large run's traces are split between PARTS children (`in_part`:
each invocation in one part, by a hash of its id), so that the cores publish leaves
idle (while it finalizes the table, once it has written the report) build traces too; SQLite
takes their chunks one transaction at a time (a chunk's insert is a fraction of its build).
Each child (`python -m kvscope.trace_job`, a fresh interpreter: no fork of a process holding
MLflow's and pyarrow's threads) reads the run's streams (payloads, tools: while the table is
finalized), then its part of the finalized requests.parquet, writes as
`kvscope.traces.write_traces` does, drains MLflow's queue (traces written the fluent way) and
leaves its TraceWrite as JSON in a result file of its part.

A part whose child wrote nothing (it failed before its first write) is in `left`: the caller
writes it itself, none twice. A child that fails after it began writing is not rerun: its
part counts the traces it was to write (its plans, counted before writing) so the run's audit
counts what is missing as dropped, and the log says why.
"""

import json
import logging
import os
import subprocess
import sys
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvscope.records.requests import REQUESTS_JSONL

if TYPE_CHECKING:
    import pyarrow as pa

    from kvscope.traces import TraceWrite

log = logging.getLogger(__name__)

RESULT = ".traces.json"  # in the run directory while the job runs: a part's TraceWrite
PLANNED = ".traces.planned"  # written before a part's first trace: how many it was to write
GO = b"go\n"  # the parent's word on the children's stdin: the finalized table is written
PARTS = 2  # children for a large run on a machine of 2 cores or more
SPLIT_FROM = 8 << 20  # bytes of requests.jsonl (~4,500 calls): a smaller run gets one child


Part = tuple[int, int]  # (index, parts): the traces whose key hashes to index mod parts
WHOLE: Part = (0, 1)


def in_part(requests: "pa.Table", part: Part) -> "pa.Table":
    """The rows of `part`: each trace's rows in one part (an invocation's by its
    workflow_run_id, a graph-less call's by its request_uuid), parts of about equal size."""
    import pyarrow as pa

    index, parts = part
    if parts == 1:
        return requests
    uuids = requests.column("request_uuid").to_pylist()
    runs = requests.column("workflow_run_id").to_pylist()
    keys = [r if r is not None else u for r, u in zip(runs, uuids, strict=True)]
    return requests.filter(pa.array([zlib.crc32(k.encode()) % parts == index for k in keys]))


def parts_for(run_dir: Path) -> int:
    """How many children write `run_dir`'s traces: PARTS where the run is large enough to pay
    for a second interpreter (its imports: ~2 s of CPU) and the machine has the cores."""
    stream = run_dir / REQUESTS_JSONL
    size = stream.stat().st_size if stream.exists() else 0
    return PARTS if size >= SPLIT_FROM and (os.cpu_count() or 1) >= 2 else 1


def _files(run_dir: Path, index: int) -> tuple[Path, Path]:
    """A part's result and planned files."""
    return run_dir / f"{RESULT}.{index}", run_dir / f"{PLANNED}.{index}"


@dataclass(frozen=True)
class TraceJob:
    processes: tuple[subprocess.Popen[bytes], ...]  # the i-th writes part (i, len(processes))
    run_dir: Path

    @classmethod
    def start(
        cls, run_dir: Path, tracking_uri: str, experiment_id: str, run_id: str, go: bool = True,
        parts: int | None = None,
    ) -> "TraceJob | None":  # fmt: skip
        """The children started on the run directory's finalized table (`parts` of them:
        `parts_for` the run where None); None where none can be. MLflow's trace queue in this
        process is drained first (an app's own traces: in the store before a child links
        them, and no writer of this process beside the children). `go=False`: the children
        import what they need (MLflow: ~2-3 s) and wait for `go()` before they read the table
        (the table being written meanwhile); never told, they exit having written nothing."""
        import mlflow

        # here, not at the module's top: a child's interpreter would pay ~2 s of imports for it
        from kvscope.probe.child import CAPTURE_ENV

        mlflow.flush_trace_async_logging()
        count = parts or parts_for(run_dir)
        # never a profiled program's process: no probe attached at its start (probe/child.py)
        env = {k: v for k, v in os.environ.items() if k != CAPTURE_ENV}
        processes: list[subprocess.Popen[bytes]] = []
        for index in range(count):
            for path in _files(run_dir, index):
                path.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "kvscope.trace_job", str(run_dir), tracking_uri,
                    experiment_id, run_id, str(index), str(count)]  # fmt: skip
            try:
                processes.append(subprocess.Popen(argv, stdin=subprocess.PIPE, env=env,
                                                  stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.PIPE))  # fmt: skip
            except OSError as err:
                log.warning("MLflow traces: no child process (%s); writing them here", err)
                for started in processes:  # never told to go: they exit, nothing written
                    started.communicate()
                return None
        job = cls(tuple(processes), run_dir)
        if go:
            job.go()
        return job

    def go(self) -> None:
        """Tell the children the table is there: they write the traces now."""
        for process in self.processes:
            assert process.stdin is not None
            try:
                process.stdin.write(GO)
                process.stdin.flush()
            except OSError:  # the child is gone already: wait() says what it left
                pass

    def cancel(self) -> None:
        """Stop the children (publish failed before it waited for them)."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.communicate()

    def wait(self) -> "tuple[TraceWrite, list[Part]]":
        """What the children wrote, once all exit, and the parts none wrote (see the module)."""
        from kvscope.traces import TraceWrite

        try:
            errors = [process.communicate()[1] for process in self.processes]
        finally:  # interrupted: the children go too
            for process in self.processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        done, left = TraceWrite(0, 0), []
        for index, (process, err) in enumerate(zip(self.processes, errors, strict=True)):
            part = (index, len(self.processes))
            written = self._part(process, err, *_files(self.run_dir, index))
            if written is None:
                left.append(part)
            else:
                done += written
        return done, left

    @staticmethod
    def _part(
        process: subprocess.Popen[bytes], err: bytes, result: Path, planned: Path
    ) -> "TraceWrite | None":
        """One child's TraceWrite; None where it wrote nothing."""
        from kvscope.traces import TraceWrite

        try:
            if process.returncode == 0 and result.exists():
                return TraceWrite(**json.loads(result.read_text()))
            if process.returncode == 0 and not planned.exists():  # never told to go
                return None
            why = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            if not planned.exists():
                log.warning("MLflow traces: a child process failed before writing (exit %s: "
                            "%s); writing its part here", process.returncode, why[0])  # fmt: skip
                return None
            log.warning("MLflow traces: a child process failed while writing (exit %s: "
                        "%s); the run's audit counts what it did not write",
                        process.returncode, why[0])  # fmt: skip
            return TraceWrite(int(planned.read_text()), 0)
        finally:
            for path in (result, planned):
                path.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    """python -m kvscope.trace_job RUN_DIR TRACKING_URI EXPERIMENT_ID RUN_ID [PART PARTS]"""
    import mlflow
    from mlflow import MlflowClient

    from kvscope.records.run_dir import RunDir
    from kvscope.traces import Streams, write_traces

    run_dir, uri, experiment_id, run_id = Path(argv[0]), argv[1], argv[2], argv[3]
    index, count = (int(argv[4]), int(argv[5])) if len(argv) > 4 else (0, 1)
    result, planned_file = _files(run_dir, index)
    streams = Streams.load(run_dir)  # written during the run: read while the table is made
    if sys.stdin.buffer.readline() != GO:  # never told: the parent went on without traces
        return 0
    mlflow.set_tracking_uri(uri)  # the fluent writer's traces, where any
    table = RunDir.open(run_dir).requests

    def planned(count: int) -> None:
        planned_file.write_text(str(count))

    done = write_traces(run_dir, in_part(table, (index, count)), client=MlflowClient(uri),
                        experiment_id=experiment_id, run_id=run_id, on_planned=planned,
                        streams=streams)  # fmt: skip
    mlflow.flush_trace_async_logging()
    result.write_text(json.dumps(asdict(done)))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
