"""The /metrics scraper and the engines' metric maps: recorded scrapes and a stand-in server.

The stand-in serves recorded engine text (tests/fixtures), so what is parsed
is the engines' real format; only the failures (500, refused, garbage) are made up here.
"""

import itertools
import json
import math
import re
import statistics
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import SGLANG_FIXTURES, VLLM_FIXTURES, free_port

from kvscope.collect import metrics
from kvscope.collect.metrics import Sampler
from kvscope.collect.series import counter_delta, nearest
from kvscope.engines.base import COUNTERS, INSTANT_VALUES, LATENCIES, Engine
from kvscope.engines.detect import parse_metrics
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine
from kvscope.records.metrics import SCHEMA, instant_series

SGLANG_SCRAPES = [
    "metrics_tokenizer_and_scheduler.prom",
    "metrics_tokenizer_and_scheduler.later.prom",
]
VLLM_TEXT = (VLLM_FIXTURES / "metrics.prom").read_text()
VLLM_LABELS = '{"engine":"0","model_name":"smollm2"}'
SERVER_GONE = {"ConnectError", "ReadError", "RemoteProtocolError"}


def raw(text: str, name: str) -> list[float]:
    """Values of every sample line called `name` (any labels), read straight from the text."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return [float(v) for v in pattern.findall(text)]


def raw_label(text: str, name: str, label: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
    found = re.search(rf'[{{,]{label}="([^"]*)"', line)
    assert found, f"{label} not on {name}"
    return found.group(1)


def with_value(text: str, name: str, value: float) -> str:
    """The text with every `name` sample (any labels) set to `value`."""
    pattern = re.compile(rf"^({re.escape(name)}(?:\{{[^}}]*\}})?) \S+$", re.MULTILINE)
    out, n = pattern.subn(rf"\g<1> {value}", text)
    assert n, name
    return out


@pytest.fixture(scope="module")
def sglang_dir() -> Path:
    return SGLANG_FIXTURES


# --- the engine maps, on recorded scrapes --------------------------------------------------------


def test_vllm_values_from_a_recorded_scrape() -> None:
    values = VllmEngine.kvscope_values(parse_metrics(VLLM_TEXT))
    blocks = int(raw_label(VLLM_TEXT, "vllm:cache_config_info", "num_gpu_blocks"))
    block = int(raw_label(VLLM_TEXT, "vllm:cache_config_info", "block_size"))
    assert (blocks - 1) * block == 2048  # recorded with --num-gpu-blocks-override 17
    assert values["kv_capacity_tokens"] == 2048
    assert values["kv_usage"] == raw(VLLM_TEXT, "vllm:kv_cache_usage_perc")[0] == 0.0
    assert values["kv_used_tokens"] == 0.0
    assert values["running_requests"] == raw(VLLM_TEXT, "vllm:num_requests_running")[0]
    assert values["queued_requests"] == raw(VLLM_TEXT, "vllm:num_requests_waiting")[0]
    assert values["prompt_tokens_total"] == raw(VLLM_TEXT, "vllm:prompt_tokens_total")[0] == 3909
    assert values["cached_tokens_total"] == raw(VLLM_TEXT, "vllm:prompt_tokens_cached_total")[0]
    assert values["generation_tokens_total"] == raw(VLLM_TEXT, "vllm:generation_tokens_total")[0]
    # not exposed by vLLM 0.32: unknown, never 0
    assert values["cache_hit_rate"] is values["gen_throughput"] is None
    assert values["evicted_tokens_total"] is None
    assert list(values) == list(INSTANT_VALUES)


@pytest.mark.parametrize("usage", [0.25, 0.8125, 1.0])
def test_vllm_used_tokens_are_usage_times_capacity(usage: float) -> None:
    text = with_value(VLLM_TEXT, "vllm:kv_cache_usage_perc", usage)
    values = VllmEngine.kvscope_values(parse_metrics(text))
    assert values["kv_usage"] == usage
    assert values["kv_used_tokens"] == usage * 2048
    assert values["kv_used_tokens"] % 128 == 0  # whole blocks


def test_vllm_used_tokens_unknown_without_cache_config() -> None:
    text = "\n".join(ln for ln in VLLM_TEXT.splitlines() if "cache_config_info" not in ln)
    values = VllmEngine.kvscope_values(parse_metrics(text))
    assert values["kv_usage"] == 0.0
    assert values["kv_used_tokens"] is values["kv_capacity_tokens"] is None


@pytest.mark.parametrize("name", SGLANG_SCRAPES)
def test_sglang_values_from_recorded_scrapes(sglang_dir: Path, name: str) -> None:
    text = (sglang_dir / name).read_text()
    values = SglangEngine.kvscope_values(parse_metrics(text))
    assert [values["kv_capacity_tokens"]] == raw(text, "sglang:max_total_num_tokens") == [4096]
    assert [values["kv_used_tokens"]] == raw(text, "sglang:kv_used_tokens")
    assert [values["kv_usage"]] == raw(text, "sglang:token_usage")
    assert values["kv_usage"] == pytest.approx(values["kv_used_tokens"] / 4096, abs=1e-4)
    assert [values["cache_hit_rate"]] == raw(text, "sglang:cache_hit_rate")
    assert [values["running_requests"]] == raw(text, "sglang:num_running_reqs")
    assert [values["queued_requests"]] == raw(text, "sglang:num_queue_reqs")
    assert [values["gen_throughput"]] == raw(text, "sglang:gen_throughput")
    assert [values["evicted_tokens_total"]] == raw(text, "sglang:evicted_tokens_total")
    # tokenizer counters: one series per agent (cached tokens also per cache source), summed
    for kvscope, sample in [
        ("prompt_tokens_total", "sglang:prompt_tokens_total"),
        ("cached_tokens_total", "sglang:cached_tokens_total"),
        ("generation_tokens_total", "sglang:generation_tokens_total"),
    ]:
        series = raw(text, sample)
        assert len(series) >= 4
        assert values[kvscope] == sum(series)
    assert SglangEngine.counters(parse_metrics(text)) == {k: values[k] for k in COUNTERS}


def test_sglang_known_values(sglang_dir: Path) -> None:
    """The fixture README's numbers for the round-4 scrape, and the two scrapes' agreement."""
    first, later = (
        SglangEngine.kvscope_values(parse_metrics((sglang_dir / n).read_text()))
        for n in SGLANG_SCRAPES
    )
    assert (first["running_requests"], first["queued_requests"]) == (2, 1)
    assert (first["kv_usage"], first["evicted_tokens_total"]) == (0.6162, 752)
    assert first["kv_used_tokens"] == 2524
    assert later["evicted_tokens_total"] == 9056
    # every token of a finished prompt was either computed or read from the cache (device + host)
    later_text = (sglang_dir / SGLANG_SCRAPES[1]).read_text()
    prefill = dict(
        zip(
            re.findall(r'^sglang:realtime_tokens_total\{.*mode="(\w+)"', later_text, re.M),
            raw(later_text, "sglang:realtime_tokens_total"),
            strict=True,
        )
    )
    assert later["cached_tokens_total"] == prefill["prefill_cache"]
    assert later["prompt_tokens_total"] == prefill["prefill_cache"] + prefill["prefill_compute"]


def sample_names(text: str) -> set[str]:
    return {s.name for f in parse_metrics(text) for s in f.samples}


@pytest.mark.parametrize("engine", [VllmEngine, SglangEngine], ids=lambda e: e.name)
def test_every_mapped_name_is_in_the_engines_real_output(
    engine: type[Engine], request: pytest.FixtureRequest
) -> None:
    if engine is VllmEngine:
        text = VLLM_TEXT
    else:
        text = (request.getfixturevalue("sglang_dir") / SGLANG_SCRAPES[0]).read_text()
    names = sample_names(text)
    assert set(engine.metric_samples) <= set(INSTANT_VALUES)
    assert set(engine.latency_histograms) <= set(LATENCIES)
    missing = [s for s in engine.metric_samples.values() if s not in names]
    assert not missing
    for histogram in engine.latency_histograms.values():
        assert histogram.family + "_bucket" in names


def test_latency_histograms_in_kvscope_terms() -> None:
    assert set(VllmEngine.latency_histograms) == set(LATENCIES)
    assert "decode_seconds" not in SglangEngine.latency_histograms
    name = VllmEngine.kvscope_name
    assert name("vllm:e2e_request_latency_seconds_bucket", {"le": "0.3"}) == "e2e_seconds"
    assert name("vllm:request_prefill_time_seconds_sum", {}) == "prefill_seconds"
    assert name("vllm:kv_cache_usage_perc", {}) == "kv_usage"
    assert name("vllm:request_prompt_tokens_bucket", {"le": "1"}) is None
    stage = "sglang:per_stage_req_latency_seconds_count"
    assert SglangEngine.kvscope_name(stage, {"stage": "prefill_forward"}) == "prefill_seconds"
    assert SglangEngine.kvscope_name(stage, {"stage": "request_process"}) is None
    assert SglangEngine.kvscope_name("sglang:queue_time_seconds_count", {}) == "queue_seconds"


# --- counter increases and nearest samples -------------------------------------------------------


def test_counter_delta() -> None:
    assert counter_delta([100.0, 150.0, 150.0, 400.0]) == 300.0
    # restart after 150: the counter began again at 0 and reached 30, then grew to 50
    assert counter_delta([100.0, 150.0, 30.0, 50.0]) == 50.0 + 30.0 + 20.0
    assert counter_delta([5.0, None, math.nan, 7.0]) == 2.0
    assert counter_delta([42.0]) == 0.0
    assert counter_delta([]) is None
    assert counter_delta([None]) is None
    assert counter_delta(iter([1.0, 2.0])) == 1.0


POINTS = [(100, 1.0), (200, 2.0), (200, 2.5), (300, 3.0)]


@pytest.mark.parametrize(
    ("t_ns", "side", "expected"),
    [
        (99, "before", None),  # nothing sampled yet: unknown, not 0
        (99, "after", 1.0),
        (100, "before", 1.0),  # an exact hit counts on both sides
        (100, "after", 1.0),
        (150, "before", 1.0),
        (150, "after", 2.0),
        (200, "before", 2.5),  # equal times: the last one before, the first one after
        (200, "after", 2.0),
        (300, "after", 3.0),
        (301, "before", 3.0),
        (301, "after", None),
    ],
)
def test_nearest(t_ns: int, side: str, expected: float | None) -> None:
    assert nearest(POINTS, t_ns, side) == expected  # type: ignore[arg-type]


def test_nearest_edges() -> None:
    assert nearest([], 5, "before") is nearest([], 5, "after") is None
    with pytest.raises(ValueError, match="side"):
        nearest(POINTS, 5, "around")  # type: ignore[arg-type]


# --- the scraper against a stand-in server -------------------------------------------------------


class StandIn:
    """A /metrics server whose answer the test switches: a body, a status, a delay, or none."""

    def __init__(self, body: str) -> None:
        self.body, self.status, self.delay_s = body, 200, 0.0
        self.port = free_port()
        self.hits = 0
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> None:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stand_in.hits += 1
                time.sleep(stand_in.delay_s)
                data = stand_in.body.encode()
                self.send_response(stand_in.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn(VLLM_TEXT)
    yield server
    server.stop()


def engine_rows_per_scrape(text: str) -> int:
    """vLLM samples (not _created) plus the kvscope values vLLM exposes, from the raw text."""
    own = [ln for ln in text.splitlines() if ln.startswith("vllm:")]
    return len([ln for ln in own if not ln.split("{")[0].endswith("_created")]) + 8


def test_scraper_survives_errors_and_resumes(stand_in: StandIn) -> None:
    scraper = Sampler(VllmEngine, stand_in.url, "run-1", interval_s=0.05)
    phases: dict[str, tuple[int, int]] = {}

    def phase(name: str, seconds: float) -> None:
        start = time.time_ns()
        time.sleep(seconds)
        phases[name] = (start, time.time_ns())

    scraper.start()
    phase("ok", 0.3)
    stand_in.status, stand_in.body = 500, "Internal Server Error"
    phase("http500", 0.3)
    stand_in.stop()
    phase("refused", 0.3)
    stand_in.status, stand_in.body = 200, "<html>not metrics</html>"
    stand_in.start()
    phase("garbage", 0.3)
    # the engine restarted: its counters began again lower
    stand_in.body = with_value(VLLM_TEXT, "vllm:prompt_tokens_total", 100)
    phase("reset", 0.15)
    stand_in.body = with_value(VLLM_TEXT, "vllm:prompt_tokens_total", 160)
    phase("grown", 0.3)
    summary = scraper.stop()

    gaps = scraper.gaps
    assert summary.errors == len(gaps) > 0
    kinds = {
        "http500": lambda e: e == "HTTP 500",
        # refused; or reset / dropped, for a connection the server had taken as it stopped
        "refused": lambda e: e.split(":")[0] in SERVER_GONE,
        "garbage": lambda e: e.startswith("unparsable /metrics text"),
    }
    slack = 100_000_000  # a scrape sent just before a switch may be answered after it
    seen = dict.fromkeys(kinds, 0)
    for gap in gaps:
        (kind,) = [k for k, match in kinds.items() if match(gap.error)]
        start, end = phases[kind]
        assert start - slack <= gap.timestamp_ns <= end, (kind, gap)
        seen[kind] += 1
    assert all(seen.values()), seen

    used = scraper.kvscope_series()["prompt_tokens_total"]
    times = [t for t, _ in used]
    assert any(t > phases["grown"][0] for t in times)  # rows resumed after the gaps
    for name in ("http500", "refused", "garbage"):
        start, end = phases[name]
        assert not [t for t in times if start + slack < t < end - slack]  # no rows in a gap
    assert counter_delta(v for _, v in used) == 160  # 3909 -> restart at 100 -> 160
    ok = summary.scrapes - summary.errors
    assert summary.rows == ok * engine_rows_per_scrape(VLLM_TEXT)


def test_scraper_keeps_its_interval_when_scrapes_are_slow(stand_in: StandIn) -> None:
    """Each answer takes 0.1 s: sleeping the interval after each scrape would give ~2.9/s."""
    stand_in.delay_s = 0.1
    scraper = Sampler(VllmEngine, stand_in.url, "run-1", interval_s=0.25)
    scraper.start()
    time.sleep(2.0)
    summary = scraper.stop()
    assert summary.errors == 0 and summary.skipped_ticks == 0
    assert summary.samples_per_s >= 3.5
    times = [t for t, _ in scraper.kvscope_series()["kv_usage"]]
    spacing = statistics.median(b - a for a, b in itertools.pairwise(times)) / 1e9
    assert 0.2 < spacing < 0.3


def test_a_timeout_is_a_gap(stand_in: StandIn) -> None:
    stand_in.delay_s = 0.5
    scraper = Sampler(VllmEngine, stand_in.url, "run-1", interval_s=0.1, timeout_s=0.2)
    scraper.start()
    time.sleep(0.3)
    summary = scraper.stop()
    assert summary.rows == 0 and summary.errors == summary.scrapes >= 2
    assert all(g.error == "timeout after 0.2 s" for g in scraper.gaps)


def test_only_the_engines_own_metrics_count(stand_in: StandIn) -> None:
    scraper = Sampler(SglangEngine, stand_in.url, "run-1", interval_s=0.1)
    scraper.start()
    summary = scraper.stop()
    assert summary.rows == 0 and summary.errors == summary.scrapes
    assert scraper.gaps[0].error == "no sglang: metrics in the response"


@pytest.mark.parametrize("batch_rows", [1 << 16, 1000])
def test_parquet_round_trip(
    stand_in: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_rows: int
) -> None:
    monkeypatch.setattr(metrics, "_BATCH_ROWS", batch_rows)
    scraper = Sampler(VllmEngine, stand_in.url, "run-7", interval_s=0.05)
    scraper.start()
    time.sleep(0.2)
    stand_in.stop()
    time.sleep(0.1)
    summary = scraper.stop()
    path, gaps_path = scraper.write(tmp_path / "metrics.parquet")

    table = pq.read_table(path)
    assert table.schema.equals(SCHEMA)
    assert table.num_rows == summary.rows > 0
    assert table.equals(scraper.table())
    rows = table.to_pylist()
    assert {r["benchmark_run_id"] for r in rows} == {"run-7"}
    names = {r["metric_name"] for r in rows}
    assert all(n.startswith(("vllm:", "kvscope:")) for n in names)
    assert not [n for n in names if n.endswith("_created")]
    ts = [r["timestamp_ns"] for r in rows]
    assert ts == sorted(ts) and len(set(ts)) == summary.scrapes - summary.errors

    def one(metric: str, **labels: str) -> dict:
        return next(
            r for r in rows if r["metric_name"] == metric and json.loads(r["labels"]) == labels
        )

    running = one("vllm:num_requests_running", engine="0", model_name="smollm2")
    assert running["labels"] == VLLM_LABELS  # sorted keys, compact
    assert running["kvscope_name"] == "running_requests" and running["value"] == 0.0
    bucket = one("vllm:e2e_request_latency_seconds_bucket", engine="0", le="+Inf",
                 model_name="smollm2")  # fmt: skip
    assert bucket["kvscope_name"] == "e2e_seconds"
    assert bucket["value"] == raw(VLLM_TEXT, "vllm:e2e_request_latency_seconds_count")[0]
    assert (
        one("vllm:num_preemptions_total", engine="0", model_name="smollm2")["kvscope_name"] is None
    )
    capacity = one("kvscope:kv_capacity_tokens")
    assert (capacity["kvscope_name"], capacity["value"]) == ("kv_capacity_tokens", 2048.0)
    assert not [r for r in rows if r["metric_name"] == "kvscope:cache_hit_rate"]  # not exposed
    assert instant_series(table) == scraper.kvscope_series()

    doc = json.loads(gaps_path.read_text())
    assert gaps_path.name == "metrics.gaps.json"
    assert doc["summary"]["scrapes"] == summary.scrapes
    assert len(doc["gaps"]) == summary.errors >= 1  # the final scrape, after the server stopped
    assert all(g["error"].split(":")[0] in SERVER_GONE for g in doc["gaps"])


def test_empty_series_writes_a_typed_file(tmp_path: Path) -> None:
    scraper = Sampler(VllmEngine, f"http://127.0.0.1:{free_port()}/metrics", "run-0")
    scraper.start()
    scraper.stop()
    path, _ = scraper.write(tmp_path / "m.parquet")
    table = pq.read_table(path)
    assert table.num_rows == 0 and table.schema.equals(SCHEMA)


def test_scraper_lifecycle_errors(stand_in: StandIn) -> None:
    scraper = Sampler(VllmEngine, stand_in.url, "run-1")
    with pytest.raises(RuntimeError, match="not started"):
        scraper.stop()
    scraper.start()
    with pytest.raises(RuntimeError, match="already started"):
        scraper.start()
    first = scraper.stop()
    assert scraper.stop() is first
    with pytest.raises(ValueError, match="positive"):
        Sampler(VllmEngine, stand_in.url, "r", interval_s=0)
