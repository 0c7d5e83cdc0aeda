"""The engine's Prometheus /metrics, polled on a thread into a long-format series.

`Sampler` does the polling in the calling process; `scraper.MetricsScraper` runs one in a child
process, so that a busy workload in the parent cannot starve it of the GIL.

One row per engine sample per scrape, plus one per kvscope instant value (metric_name
"kvscope:<name>"), so that joins downstream need no engine's metric map. A failed scrape is a gap
with its time and reason; it never stops the scraper.
"""

import json
import math
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypedDict, Unpack

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client.metrics_core import Metric

from kvscope.engines import auth
from kvscope.engines.base import Engine, parse_metrics
from kvscope.records.base import JsonlWriter
from kvscope.records.metrics import (
    KVSCOPE_PREFIX,
    SCHEMA,
    InstantValues,
    ScrapeGap,
    ScrapeSummary,
    write_gaps,
)

_BATCH_ROWS = 1 << 16  # rows per Parquet row group; bounds the memory write() needs
_ERROR_CHARS = 300

Labels = tuple[tuple[str, str], ...]


class _Columns:
    """The series, kept compact: each (metric, labels) is stored once, a row is an id + a value.

    30 minutes at 4 Hz of vLLM's ~330 rows a scrape: 2.4 M rows, ~35 MB (SGLang's ~1,140: ~110 MB).
    """

    def __init__(self, name_of: Callable[[str, Mapping[str, str]], str | None]) -> None:
        self.name_of = name_of  # kvscope's name for a series, asked once per series
        self.ids: dict[tuple[str, Labels], int] = {}
        self.metric: list[str] = []
        self.labels: list[str] = []
        self.kvscope: list[str | None] = []
        self.scrape_ts = array("q")
        self.scrape_end = array("q")  # row count after each scrape
        self.series = array("i")
        self.values = array("d")

    def series_id(self, metric: str, labels: Mapping[str, str]) -> int:
        key = (metric, tuple(sorted(labels.items())))
        sid = self.ids.get(key)
        if sid is None:
            sid = self.ids[key] = len(self.metric)
            self.metric.append(metric)
            self.labels.append(json.dumps(dict(key[1]), separators=(",", ":")))
            self.kvscope.append(self.name_of(metric, labels))
        return sid

    def add_scrape(self, ts: int, series: array, values: array) -> None:
        self.series.extend(series)
        self.values.extend(values)
        self.scrape_ts.append(ts)
        self.scrape_end.append(len(self.series))


class SamplerOptions(TypedDict, total=False):
    interval_s: float  # between scrapes (default 0.25)
    timeout_s: float  # of one scrape (default 1.0)
    instant_path: Path | None  # metrics.kvscope.jsonl: kvscope's values per scrape, as they come
    api_key_env: str | None  # the variable holding the engine's API key (engines/auth.py)


class Sampler:
    """Scrapes `url` every `interval_s` from start() to stop(); write() saves the series."""

    def __init__(self, engine: type[Engine], url: str, benchmark_run_id: str,
                 **options: Unpack[SamplerOptions]) -> None:  # fmt: skip
        interval_s, timeout_s = options.get("interval_s", 0.25), options.get("timeout_s", 1.0)
        instant_path = options.get("instant_path")
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        if not engine.metric_prefix:
            raise ValueError(f"engine {engine.name!r} has no metric names kvscope can read")
        self.engine, self.url, self.benchmark_run_id = engine, url, benchmark_run_id
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.api_key_env = options.get("api_key_env")
        self._columns = _Columns(self._kvscope_name)
        self._instant: dict[str, list[tuple[int, float]]] = {}
        self._gaps: list[ScrapeGap] = []
        self._scrapes = self._skipped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None
        self._started = 0.0
        self._summary: ScrapeSummary | None = None
        # kvscope's instant values, one JSON line per scrape as it happens: what a crashed run
        # keeps (the full series is written as Parquet only at stop()).
        self.instant_path = instant_path
        self._instant_stream: JsonlWriter[InstantValues] | None = None

    def start(self) -> None:
        """Start scraping; returns once the first scrape is done (or failed)."""
        if self._thread is not None:
            raise RuntimeError("the scraper was already started")
        self._client = httpx.Client(timeout=self.timeout_s, headers=auth.headers(self.api_key_env))
        if self.instant_path is not None:
            self._instant_stream = JsonlWriter(self.instant_path)
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="kvscope-metrics", daemon=True)
        self._thread.start()
        # so that the workload's first request has a sample before it
        self._first.wait(self.timeout_s + 1.0)

    def stop(self) -> ScrapeSummary:
        if self._thread is None or self._client is None:
            raise RuntimeError("the scraper was not started")
        if self._summary is not None:
            return self._summary
        self._stop.set()
        self._thread.join(2 * self.timeout_s + self.interval_s)
        if not self._thread.is_alive():
            self._scrape()  # so that the workload's last request has a sample after it
        self._client.close()
        if self._instant_stream is not None:
            self._instant_stream.close()
        self._summary = self.summary(time.monotonic() - self._started)
        return self._summary

    def summary(self, duration_s: float | None = None) -> ScrapeSummary:
        """The numbers so far (stop() returns the final ones)."""
        if duration_s is None:
            duration_s = time.monotonic() - self._started if self._started else 0.0
        with self._lock:
            scrapes, errors = self._scrapes, len(self._gaps)
            rows = len(self._columns.series)
        ok = scrapes - errors
        return ScrapeSummary(
            scrapes=scrapes,
            errors=errors,
            rows=rows,
            duration_s=duration_s,
            samples_per_s=ok / duration_s if duration_s > 0 else 0.0,
            skipped_ticks=self._skipped,
        )

    @property
    def gaps(self) -> list[ScrapeGap]:
        with self._lock:
            return list(self._gaps)

    def kvscope_series(self) -> dict[str, list[tuple[int, float]]]:
        """kvscope instant value -> [(timestamp_ns, value)] in time order (exposed values only)."""
        with self._lock:
            return {name: list(points) for name, points in self._instant.items()}

    def table(self) -> pa.Table:
        return pa.Table.from_batches(list(self._batches()), schema=SCHEMA)

    def write(self, path: Path) -> tuple[Path, Path]:
        """The series as Parquet at `path`, the gaps and summary as JSON beside it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(path, SCHEMA) as writer:
            for batch in self._batches():
                writer.write_batch(batch)
        gaps_path = path.with_name(path.stem + ".gaps.json")
        header = {"benchmark_run_id": self.benchmark_run_id, "url": self.url,
                  "interval_s": self.interval_s}  # fmt: skip
        write_gaps(gaps_path, header, self._summary or self.summary(), self.gaps)
        return path, gaps_path

    def _loop(self) -> None:
        # Deadlines on the monotonic clock: the scrape's own time does not stretch the interval.
        deadline = time.monotonic()
        while not self._stop.is_set():
            self._scrape()
            self._first.set()
            deadline += self.interval_s
            now = time.monotonic()
            behind = now - deadline
            if behind > 2 * self.interval_s:
                # Far behind (engine stalled): drop the missed ticks instead of a long catch-up.
                self._skipped += math.floor(behind / self.interval_s)
                deadline = now
            # Slightly behind (a busy engine answered slowly): the next scrape starts at once,
            # one after another, so the long-run rate stays 1 / interval.
            self._stop.wait(deadline - now)

    def _scrape(self) -> None:
        assert self._client is not None
        sent = time.time_ns()
        try:
            resp = self._client.get(self.url)
            ts = (sent + time.time_ns()) // 2  # the engine rendered it between send and receipt
            if resp.status_code != 200:
                raise _Failed(f"HTTP {resp.status_code}")
            try:
                families = parse_metrics(resp.text)
            except ValueError as err:
                raise _Failed(f"unparsable /metrics text: {err}") from None
            prefix = self.engine.metric_prefix
            own = [f for f in families if f.name.startswith(prefix)]
            if not own:
                raise _Failed(f"no {prefix} metrics in the response")
            self._record(ts, own)
        except _Failed as err:
            self._gap(sent, str(err))
        except httpx.TimeoutException:
            self._gap(sent, f"timeout after {self.timeout_s:g} s")
        except Exception as err:  # refused, reset, a parser or mapping error: a gap, not the end
            self._gap(sent, f"{type(err).__name__}: {err}")
        finally:
            with self._lock:
                self._scrapes += 1

    def _record(self, ts: int, families: list[Metric]) -> None:
        values = self.engine.kvscope_values(families)
        series, samples = array("i"), array("d")
        with self._lock:
            cols = self._columns
            for family in families:
                for s in family.samples:
                    if s.name.endswith("_created"):
                        continue
                    series.append(cols.series_id(s.name, s.labels))
                    samples.append(s.value)
            for name, v in values.items():
                if v is None:
                    continue
                series.append(cols.series_id(KVSCOPE_PREFIX + name, {}))
                samples.append(v)
                self._instant.setdefault(name, []).append((ts, v))
            cols.add_scrape(ts, series, samples)
            if self._instant_stream is not None:
                known = {k: v for k, v in values.items() if v is not None}
                self._instant_stream.append(InstantValues(ts, known))

    def _kvscope_name(self, metric: str, labels: Mapping[str, str]) -> str | None:
        if metric.startswith(KVSCOPE_PREFIX):
            return metric.removeprefix(KVSCOPE_PREFIX)
        return self.engine.kvscope_name(metric, labels)

    def _gap(self, ts: int, error: str) -> None:
        with self._lock:
            self._gaps.append(ScrapeGap(ts, error[:_ERROR_CHARS]))

    def _batches(self) -> Iterator[pa.RecordBatch]:
        with self._lock:
            cols = self._columns
            scrape_ts, scrape_end = cols.scrape_ts[:], cols.scrape_end[:]
            metric = pa.array(cols.metric, pa.string())
            labels = pa.array(cols.labels, pa.string())
            kvscope = pa.array(cols.kvscope, pa.string())
        first = start = 0  # first scrape and first row of the batch
        for i, end in enumerate(scrape_end):
            if end - start < _BATCH_ROWS and i + 1 < len(scrape_end):
                continue
            ts = array("q")
            prev = start
            for t, e in zip(scrape_ts[first : i + 1], scrape_end[first : i + 1], strict=True):
                ts.extend([t] * (e - prev))
                prev = e
            with self._lock:
                series, values = cols.series[start:end], cols.values[start:end]
            ids = _arrow(series, pa.int32())
            yield pa.RecordBatch.from_arrays(
                [
                    _arrow(ts, pa.int64()),
                    pa.repeat(pa.scalar(self.benchmark_run_id, pa.string()), end - start),
                    pc.take(metric, ids),
                    pc.take(labels, ids),
                    _arrow(values, pa.float64()),
                    pc.take(kvscope, ids),
                ],
                schema=SCHEMA,
            )
            first, start = i + 1, end


class _Failed(Exception):
    """A scrape that got an answer, but not one with this engine's samples."""


def _arrow(values: array, type_: pa.DataType) -> pa.Array:
    """A fixed-width Arrow array over an array.array's buffer, without a copy."""
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])
