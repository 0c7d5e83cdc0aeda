"""The /metrics sampler in a child process of its own.

In the workload's process the sampler shares the GIL with LangGraph, the OpenAI client's stream
parsing and MLflow's span export; on a 2-core machine whose cores the engine keeps busy, a 15 ms
parse there was seen to take 3 s, and the series fell to ~3 samples/s at a 0.2 s interval. A child
process is scheduled on its own: it sleeps most of the time, so the OS wakes it on time.

The child is a fresh `python` running serve(), not a multiprocessing spawn, which would re-run
the user's main script if it lacks an `if __name__ == "__main__"` guard. It reads its arguments as
one JSON line on stdin, says "ready" on stdout after its first scrape, and stops on "stop"; an end
of stdin without "stop" means the parent died, and the child leaves without writing.
"""

import importlib
import json
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Unpack

import pyarrow as pa
import pyarrow.parquet as pq

from kvscope.collect.metrics import Sampler, SamplerOptions
from kvscope.engines.base import Engine
from kvscope.records.metrics import (
    METRICS_GAPS,
    METRICS_PARQUET,
    SCHEMA,
    ScrapeGap,
    ScrapeSummary,
    Series,
    instant_series,
    instant_series_jsonl,
    read_gaps,
)

_SERIES, _GAPS = METRICS_PARQUET, METRICS_GAPS  # written in the child's folder, then moved
_START_S = 60.0  # a fresh interpreter importing pyarrow on a loaded machine: seconds, not minutes
_WRITE_S = 120.0  # the final Parquet of a long run


class MetricsScraper:
    """A `Sampler` in a child process: start() and stop() in the parent, the series back after.

    If the child dies before it wrote its series, stop() returns None and `error` says why;
    what the child appended to `instant_path` per scrape is then all there is. discard() removes
    its temporary folder when the owner is done with it, written or not.
    """

    def __init__(self, engine: type[Engine], url: str, benchmark_run_id: str,
                 **options: Unpack[SamplerOptions]) -> None:  # fmt: skip
        # The Sampler checks the arguments here, before a process is started for them; the
        # child gets them as it read them (defaults filled in).
        s = Sampler(engine, url, benchmark_run_id, **(options | {"instant_path": None}))
        self.instant_path = options.get("instant_path")
        self._args: dict[str, Any] = {
            "engine": f"{engine.__module__}:{engine.__qualname__}", "url": url,
            "benchmark_run_id": benchmark_run_id, "interval_s": s.interval_s,
            "timeout_s": s.timeout_s, "api_key_env": s.api_key_env,
            "instant_path": str(self.instant_path) if self.instant_path else None,
        }  # fmt: skip
        self.error: str | None = None
        self._dir = Path()
        self._process: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._summary: ScrapeSummary | None = None
        self._gaps: list[ScrapeGap] = []
        self._series: Path | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Start the child; returns once its first scrape is done (or failed)."""
        if self._process is not None:
            raise RuntimeError("the scraper was already started")
        self._dir = Path(tempfile.mkdtemp(prefix="kvscope-metrics-"))
        self._process = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # Its own session: with the kernel's autogroup scheduling (the default on desktop
            # and many server kernels) a session shares the CPU equally with the others, so
            # the workload's busy session cannot crowd out the child's few milliseconds.
            start_new_session=True,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        args = json.dumps(self._args | {"out": str(self._dir)})
        self._process.stdin.write(args.encode() + b"\n")
        self._process.stdin.flush()
        line = _readline(self._process.stdout, _START_S + self._args["timeout_s"])
        if line == b"":  # the end of its stdout: the child is gone
            code = self._process.wait()
            shutil.rmtree(self._dir, ignore_errors=True)
            self.error = f"the /metrics scraper process exited at start (code {code})"
            raise RuntimeError(self.error)
        # None: no "ready" yet from a live child; slow, not dead, and the series begins late.

    def stop(self) -> ScrapeSummary | None:
        """Stop the child and take back its series (once; later calls return the same)."""
        if self._process is None:
            raise RuntimeError("the scraper was not started")
        if self._stopped:
            return self._summary
        self._stopped = True
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(b"stop\n")
            self._process.stdin.close()
        except OSError:
            pass  # the child is gone: below says so
        try:
            self._process.wait(2 * self._args["timeout_s"] + self._args["interval_s"] + _WRITE_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            self.error = "the /metrics scraper process did not stop in time and was killed"
        gaps = self._dir / _GAPS
        if gaps.exists() and (self._dir / _SERIES).exists():
            self._summary, self._gaps = read_gaps(gaps)
            self._series = self._dir / _SERIES
        elif self.error is None:
            self.error = (
                f"the /metrics scraper process ended (code {self._process.returncode}) "
                "before it wrote its series"
            )
        return self._summary

    def summary(self) -> ScrapeSummary | None:
        """The final numbers: None before stop() or when the child left none."""
        return self._summary

    @property
    def gaps(self) -> list[ScrapeGap]:
        return list(self._gaps)

    def table(self) -> pa.Table:
        if self._series is None:
            return SCHEMA.empty_table()
        return pq.read_table(self._series)

    def kvscope_series(self) -> Series:
        """kvscope instant value -> [(timestamp_ns, value)] in time order."""
        if self._series is not None:
            return instant_series(self.table())
        if self.instant_path is not None and self.instant_path.exists():
            return instant_series_jsonl(self.instant_path)
        return {}

    def write(self, path: Path) -> tuple[Path, Path] | None:
        """Move the series to `path` (Parquet) and its gaps JSON beside it; None without one."""
        if self._series is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        gaps = path.with_name(path.stem + ".gaps.json")
        shutil.move(self._series, path)
        shutil.move(self._series.with_name(_GAPS), gaps)
        if self._series.parent == self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._series = path
        return path, gaps

    def discard(self) -> None:
        """Remove the child's temporary folder once the owner is done (again: nothing to do).

        A series write() moved out stays where it went. A child still sampling is killed first:
        it would write its series into the folder again.
        """
        if self._process is not None and not self._stopped:
            self._stopped = True
            self._process.kill()
            self._process.wait()
            self.error = self.error or "the /metrics scraper was discarded before it was stopped"
        if self._dir == Path():  # never started, or discarded already: not a folder of ours
            return
        if self._series is not None and self._series.parent == self._dir:
            self._series = None  # not written out: it goes with the folder
        shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = Path()


def _readline(stream: IO[bytes], timeout_s: float) -> bytes | None:
    """One line from a pipe (b"" at its end), or None if none came in time."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return None
    return stream.readline()


def serve() -> None:
    """The child: sample until told to stop, then write the series to the folder it was given."""
    args = json.loads(sys.stdin.readline())
    out = Path(args.pop("out"))
    module, name = args.pop("engine").split(":")
    engine = getattr(importlib.import_module(module), name)
    instant = args.pop("instant_path")
    stop, why = threading.Event(), []

    def watch_stdin() -> None:
        why.append("stop" if sys.stdin.readline() == "stop\n" else "orphaned")
        stop.set()

    def terminated(*_: object) -> None:
        why.append("stop")
        stop.set()

    # The parent decides when sampling ends (after a Ctrl-C too, which reaches its process group,
    # not this session): a stray SIGINT is ignored; a SIGTERM ends the sampling as "stop" does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, terminated)
    sampler = Sampler(engine, **args, instant_path=Path(instant) if instant else None)
    sampler.start()
    print("ready", flush=True)
    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.wait(0.5):
        pass
    sampler.stop()
    if why[0] == "orphaned":  # the parent died: nobody will read the series
        shutil.rmtree(out, ignore_errors=True)
        return
    sampler.write(out / _SERIES)
