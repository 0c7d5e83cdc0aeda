"""The run's baseline for the engine counters: a counter the first scrape did not have.

A live SGLang 0.5.23 run printed cached tokens "differs by -381": its /metrics lists no
`sglang:cached_tokens_total` at all before the first cache hit (prometheus_client's
multiprocess mode lists a family only once it has a sample), so the delta began at the first
scrape that had it, after the first hit. The two scrapes here are from a fresh SGLang 0.5.23
(tests/fixtures/sglang-0.5.23/README.md, "Fresh-server scrapes").
"""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import SGLANG_FIXTURES
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvscope.analysis.reconcile import counter_values, reconcile
from kvscope.analysis.server import server_summary
from kvscope.collect.metrics import Sampler
from kvscope.collect.series import counter_delta, from_first_scrape
from kvscope.engines.base import parse_metrics
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine
from kvscope.records import metrics

FRESH = (SGLANG_FIXTURES / "metrics_fresh_server.prom").read_text()
AFTER = (SGLANG_FIXTURES / "metrics_after_hit.prom").read_text()
# The usage of the four chat calls made between the two scrapes: (prompt, cached) tokens.
CALLS = [(24, 0), (707, 3), (711, 695), (708, 700)]
ROWS = [{"prompt_tokens": p, "cached_tokens": c} for p, c in CALLS]


def test_the_fresh_scrape_has_no_cached_tokens_family() -> None:
    """What SGLang 0.5.23 serves: the family is absent (not listed empty) before the first hit;
    the prompt counter is there, from the startup warm-up request (6 tokens, agent="")."""
    assert "sglang:cached_tokens" not in FRESH
    fresh = SglangEngine.counters(parse_metrics(FRESH))
    after = SglangEngine.counters(parse_metrics(AFTER))
    assert fresh["cached_tokens_total"] is None and fresh["prompt_tokens_total"] == 6
    assert after["cached_tokens_total"] == sum(c for _, c in CALLS) == 1398
    assert after["prompt_tokens_total"] == 6 + sum(p for p, _ in CALLS)


class Scrapes:
    """A /metrics server answering `body`, which the test switches between scrapes."""

    def __init__(self, body: str) -> None:
        self.body = body
        scrapes = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = scrapes.body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"


@pytest.fixture
def scrapes() -> Iterator[Scrapes]:
    s = Scrapes(FRESH)
    yield s
    s.server.shutdown()
    s.server.server_close()


def test_a_fresh_sglang_reconciles_exactly(scrapes: Scrapes, tmp_path: Path) -> None:
    """The sampler's first scrape (the baseline, before the first call) and its last (at stop),
    written and read back as a run's series, against the calls' usage."""
    sampler = Sampler(SglangEngine, scrapes.url, "run-1", interval_s=600)
    sampler.start()  # the first scrape: the fresh server
    scrapes.body = AFTER  # ... the four calls ...
    sampler.stop()  # the last scrape
    sampler.write(tmp_path / metrics.METRICS_PARQUET)
    series = metrics.load_series(tmp_path)
    assert len(series["kv_capacity_tokens"]) == 2 and len(series["cached_tokens_total"]) == 1
    checks = {r.counter: r for r in reconcile(ROWS, counter_values(series), counter_delta)}
    cached, prompt = checks["cached_tokens_total"], checks["prompt_tokens_total"]
    assert (cached.requests_sum, cached.engine_delta, cached.exact) == (1398, 1398.0, True)
    assert (prompt.requests_sum, prompt.engine_delta, prompt.exact) == (2150, 2150.0, True)
    assert server_summary(series)["hit_rate_from_counters"] == 1398 / 2150


def test_from_first_scrape() -> None:
    series = {
        "kv_usage": [(10, 0.0), (20, 0.5), (30, 0.1)],  # every scrape
        "prompt_tokens_total": [(10, 6.0), (30, 30.0)],
        "cached_tokens_total": [(20, 3.0), (30, 9.0)],  # created at the first hit
    }
    names = ("prompt_tokens_total", "cached_tokens_total", "evicted_tokens_total")
    out = from_first_scrape(series, names)
    assert out["prompt_tokens_total"] == series["prompt_tokens_total"]  # had the baseline
    assert out["cached_tokens_total"] == [(10, 0.0), (20, 3.0), (30, 9.0)]
    assert "evicted_tokens_total" not in out  # never seen: not exposed, its increase None
    assert counter_delta(v for _, v in out["cached_tokens_total"]) == 9.0
    assert from_first_scrape({}, names) == {}


def test_a_counter_family_listed_without_samples_is_zero() -> None:
    """A single-process prometheus_client registry lists a labelled counter's family (HELP and
    TYPE) before its first label set: exposed, nothing counted (0). An absent family: None."""
    registry = CollectorRegistry()
    Gauge("sglang:max_total_num_tokens", "capacity", registry=registry).set(8192)
    cached = Counter("sglang:cached_tokens", "cached", ["agent"], registry=registry)
    text = generate_latest(registry).decode()
    assert "# TYPE sglang:cached_tokens_total counter" in text
    assert "sglang:cached_tokens_total{" not in text  # no sample yet
    values = SglangEngine.kvscope_values(parse_metrics(text))
    assert values["cached_tokens_total"] == 0.0
    assert values["prompt_tokens_total"] is None  # not in the scrape at all
    assert values["kv_capacity_tokens"] == 8192
    cached.labels(agent="planner").inc(381)
    values = SglangEngine.kvscope_values(parse_metrics(generate_latest(registry).decode()))
    assert values["cached_tokens_total"] == 381


def test_a_gauge_family_without_samples_stays_unknown() -> None:
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "running", ["engine"], registry=registry)
    values = VllmEngine.kvscope_values(parse_metrics(generate_latest(registry).decode()))
    assert values["running_requests"] is None  # a gauge never set is not a measured 0


def test_engine_check_counts_a_counter_first_listed_after_from_zero() -> None:
    from kvscope.engines.smoke import SmokeResult

    before = {"prompt_tokens_total": 6.0, "cached_tokens_total": None}
    after = {"prompt_tokens_total": 2156.0, "cached_tokens_total": 1398.0}
    check = SmokeResult("m", (), before, after, {}, {}, 0)
    assert check.counter_delta("prompt_tokens_total") == 2150
    assert check.counter_delta("cached_tokens_total") == 1398  # not listed before: 0 then
    unread = SmokeResult("m", (), dict.fromkeys(after), after, {}, {}, 0)
    assert unread.counter_delta("cached_tokens_total") is None  # the before-scrape failed
    assert check.counter_delta("evicted_tokens_total") is None  # never listed: not exposed
