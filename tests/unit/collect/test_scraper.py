"""The /metrics sampler in its own process: it keeps its rate while the parent is busy, and its
series comes back (or its loss is said) however the run ends.

The server is `python -m http.server` on a recorded vLLM scrape, in a process of its own too:
a server in the test's process would stall with it.
"""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from helpers import VLLM_FIXTURES, free_port

from kvscope.collect.scraper import MetricsScraper
from kvscope.engines.vllm import VllmEngine
from kvscope.records.metrics import SCHEMA, instant_series

New = Callable[..., MetricsScraper]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("www")
    (root / "metrics").write_text((VLLM_FIXTURES / "metrics.prom").read_text())
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", str(root), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 20
    while not up(url):
        assert time.monotonic() < deadline, "http.server did not start"
        time.sleep(0.1)
    yield url
    server.kill()
    server.wait()


@pytest.fixture
def new() -> Iterator[New]:
    """MetricsScraper(...), each discarded after the test: no temporary folder left behind."""
    made: list[MetricsScraper] = []

    def make(*args: Any, **kwargs: Any) -> MetricsScraper:
        made.append(MetricsScraper(*args, **kwargs))
        return made[-1]

    yield make
    for scraper in made:
        scraper.discard()


def up(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 200
    except httpx.TransportError:
        return False


def gone(pid: int, within_s: float) -> bool:
    """The process ended (a zombie no reaper collects counts as ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_keeps_its_rate_while_the_parent_holds_the_gil(url: str, new: New) -> None:
    scraper = new(VllmEngine, url, "run-1", interval_s=0.05)
    scraper.start()
    begin = time.time_ns()
    for _ in range(3):
        sum(range(30_000_000))  # a C loop: holds this process's GIL throughout (~0.4 s each)
    end = time.time_ns()
    time.sleep(0.1)
    summary = scraper.stop()
    assert summary is not None and summary.errors == 0
    times = [t for t, _ in scraper.kvscope_series()["kv_usage"]]
    during = [t for t in times if begin < t < end]
    # A thread in this process got 1 sample in ~1.3 s here, with a 1.1 s hole.
    assert len(during) >= 0.5 * (end - begin) / 50e6
    assert max(b - a for a, b in itertools.pairwise([begin, *during, end])) < 0.4e9


def test_the_series_comes_back(url: str, new: New, tmp_path: Path) -> None:
    instant = tmp_path / "metrics.kvscope.jsonl"
    scraper = new(VllmEngine, url, "run-2", interval_s=0.05, instant_path=instant)
    assert scraper.summary() is None
    scraper.start()
    time.sleep(0.3)
    summary = scraper.stop()
    assert summary is not None and scraper.error is None
    assert summary.errors == 0 and summary.scrapes >= 4
    written = scraper.write(tmp_path / "out" / "metrics.parquet")
    assert written is not None
    path, gaps_path = written
    table = pq.read_table(path)
    assert table.schema.equals(SCHEMA) and table.num_rows == summary.rows
    assert table.equals(scraper.table())
    assert {r["benchmark_run_id"] for r in table.select(["benchmark_run_id"]).to_pylist()} == {
        "run-2"
    }
    series = scraper.kvscope_series()
    assert series == instant_series(table)
    assert len(series["kv_usage"]) == summary.scrapes
    lines = instant.read_text().splitlines()
    assert len(lines) == summary.scrapes  # the child appended one line per scrape
    doc = json.loads(gaps_path.read_text())
    assert gaps_path.name == "metrics.gaps.json" and doc["summary"]["scrapes"] == summary.scrapes


def test_ctrl_c_is_the_parents_to_handle(url: str, new: New) -> None:
    """A SIGINT (a Ctrl-C, should one reach it) must not end the child before stop()."""
    scraper = new(VllmEngine, url, "run-3", interval_s=0.05)
    scraper.start()
    assert scraper.pid is not None
    os.kill(scraper.pid, signal.SIGINT)
    signalled = time.time_ns()
    time.sleep(0.3)
    summary = scraper.stop()
    assert summary is not None and scraper.error is None
    assert [t for t, _ in scraper.kvscope_series()["kv_usage"] if t > signalled + 0.1e9]


def test_sigterm_ends_the_sampling_with_the_series_written(url: str, new: New) -> None:
    scraper = new(VllmEngine, url, "run-4", interval_s=0.05)
    scraper.start()
    assert scraper.pid is not None
    time.sleep(0.2)
    os.kill(scraper.pid, signal.SIGTERM)
    assert gone(scraper.pid, 10)
    summary = scraper.stop()
    assert summary is not None and summary.scrapes >= 2 and scraper.error is None


def test_a_killed_child_is_said_and_its_jsonl_kept(url: str, new: New, tmp_path: Path) -> None:
    instant = tmp_path / "metrics.kvscope.jsonl"
    scraper = new(VllmEngine, url, "run-5", interval_s=0.05, instant_path=instant)
    scraper.start()
    assert scraper.pid is not None
    time.sleep(0.3)
    os.kill(scraper.pid, signal.SIGKILL)
    assert scraper.stop() is None
    assert scraper.error == (
        "the /metrics scraper process ended (code -9) before it wrote its series"
    )
    assert scraper.write(tmp_path / "metrics.parquet") is None
    assert not (tmp_path / "metrics.parquet").exists()  # finalize then reads the JSONL
    assert scraper.table().num_rows == 0 and scraper.table().schema.equals(SCHEMA)
    kept = scraper.kvscope_series()["kv_usage"]
    assert len(kept) == len(instant.read_text().splitlines()) >= 3


def test_discard_removes_the_folder_and_keeps_what_was_written(
    url: str, new: New, tmp_path: Path
) -> None:
    stopped = new(VllmEngine, url, "run-9", interval_s=0.05)
    stopped.start()
    folder = stopped._dir
    assert stopped.stop() is not None and (folder / "metrics.parquet").exists()
    stopped.discard()
    assert not folder.exists()
    stopped.discard()  # again: nothing to do
    assert stopped.table().num_rows == 0 and stopped.error is None

    written = new(VllmEngine, url, "run-10", interval_s=0.05)
    written.start()
    folder = written._dir
    assert written.stop() is not None
    out = written.write(tmp_path / "metrics.parquet")
    assert out is not None and not folder.exists()
    written.discard()
    assert out[0].exists() and out[1].exists() and written.table().num_rows > 0


def test_discard_kills_a_child_still_sampling(url: str, new: New) -> None:
    scraper = new(VllmEngine, url, "run-11", interval_s=0.05)
    scraper.start()
    pid, folder = scraper.pid, scraper._dir
    assert pid is not None
    scraper.discard()
    assert gone(pid, 10) and not folder.exists()
    assert scraper.error == "the /metrics scraper was discarded before it was stopped"
    assert scraper.stop() is None


def test_an_orphaned_child_leaves(url: str, tmp_path: Path) -> None:
    """The parent is SIGKILLed: the child must not sample forever, nor leave its folder."""
    script = (
        "import os, sys\n"
        "from kvscope.collect.scraper import MetricsScraper\n"
        "from kvscope.engines.vllm import VllmEngine\n"
        f"s = MetricsScraper(VllmEngine, {url!r}, 'run-6', interval_s=0.05)\n"
        "s.start()\n"
        "print(s.pid, s._dir, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pid, folder = out.stdout.split()
    assert gone(int(pid), 10)
    assert not Path(folder).exists()


def test_a_child_that_cannot_start_is_an_error(url: str, new: New, tmp_path: Path) -> None:
    scraper = new(
        VllmEngine, url, "run-7", instant_path=tmp_path / "no" / "such" / "dir" / "x.jsonl"
    )
    with pytest.raises(RuntimeError, match=r"exited at start \(code 1\)"):
        scraper.start()


def test_lifecycle_errors(url: str, new: New) -> None:
    scraper = new(VllmEngine, url, "run-8")
    with pytest.raises(RuntimeError, match="not started"):
        scraper.stop()
    scraper.start()
    with pytest.raises(RuntimeError, match="already started"):
        scraper.start()
    first = scraper.stop()
    assert first is not None and scraper.stop() is first
    with pytest.raises(ValueError, match="positive"):
        MetricsScraper(VllmEngine, url, "r", interval_s=0)
