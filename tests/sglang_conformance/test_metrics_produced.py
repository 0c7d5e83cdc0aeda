"""kvscope's /metrics path on text that SGLang 0.5.23's own collectors produce.

SGLang's tokenizer collector (agent label on, from kvscope's flags), scheduler collector and
radix cache are fed known requests, stats and evictions (produce_with_sglang.py) and serve
/metrics where kvscope's endpoints say. kvscope's parser, engine maps, scraper and per-agent
view must give back what was fed. Opt-in (`-m sglang`, scripts/test-sglang.sh).
"""

import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from sglang_producer import FinishedRequest, SglangProducer

from kvscope.analysis.server_agents import per_agent_server
from kvscope.collect.metrics import Sampler
from kvscope.collect.series import counter_delta
from kvscope.engines.base import LATENCIES
from kvscope.engines.detect import fetch_metrics
from kvscope.engines.sglang import SglangEngine

pytestmark = pytest.mark.sglang


def scrape(engine: SglangEngine) -> list[Metric]:
    """One GET of the engine's /metrics, parsed by kvscope, at the URL kvscope would use."""
    with httpx.Client(timeout=10) as client:
        families = fetch_metrics(client, engine.endpoints().metrics_url)
    assert families is not None, "kvscope could not read SGLang's /metrics"
    return families


def requests(tag: str, *specs: tuple[str, int, int, int]) -> list[FinishedRequest]:
    """(agent, prompt tokens, device hits, host hits) -> requests with distinct timings."""
    return [
        FinishedRequest(
            rid=f"req-{uuid.uuid4()}",
            agent=f"{tag}-{agent}",
            prompt_tokens=prompt,
            completion_tokens=10 + 7 * i,
            device_hit=device,
            host_hit=host,
            cache_details=i % 4 != 3,  # every fourth: SGLang's cache_source="total" path
            dispatch_s=0.003 + 0.001 * i,
            queue_s=0.01 * (i % 3),  # 0 included: admitted at once
            prefill_s=0.02 + 0.005 * i,
            decode_s=0.1 + 0.03 * i,
            stream=i % 2 == 1,
        )
        for i, (agent, prompt, device, host) in enumerate(specs)
    ]


def send(sglang: SglangProducer, engine: SglangEngine, reqs: Iterable[FinishedRequest]) -> None:
    for r in reqs:
        r.send(sglang, engine)


def fed_per_agent(reqs: Iterable[FinishedRequest]) -> dict[str, dict[str, float]]:
    """What per_agent_server should report for these requests, from what was fed."""
    by_agent: dict[str, list[FinishedRequest]] = defaultdict(list)
    for r in reqs:
        by_agent[r.agent].append(r)
    return {
        agent: {
            "prompt_tokens": sum(r.prompt_tokens for r in rs),
            "cached_tokens": sum(r.cached_tokens for r in rs),
            "ttft_mean_ms": statistics.fmean(r.ttft_s for r in rs) * 1000,
            "e2e_mean_ms": statistics.fmean(r.e2e_s for r in rs) * 1000,
        }
        for agent, rs in by_agent.items()
    }


def histogram_parts(families: list[Metric]) -> dict[tuple[str, str], float]:
    """(kvscope latency, "sum" | "count") -> value summed over label sets, as kvscope maps."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for family in families:
        for s in family.samples:
            name = SglangEngine.kvscope_name(s.name, s.labels)
            if name in LATENCIES and s.name.endswith(("_sum", "_count")):
                out[(name, s.name.rsplit("_", 1)[1])] += s.value
    return out


def test_metrics_are_where_kvscope_looks(sglang: SglangProducer, engine: SglangEngine) -> None:
    # SGLang serves /metrics on the host and port it parsed from kvscope's flags.
    assert engine.endpoints().metrics_url == sglang.metrics_url
    assert sglang.info["multiprocess"]  # Prometheus multiprocess mode, as the real server
    # --tokenizer-metrics-allowed-custom-labels agent put the label on the tokenizer metrics
    assert "agent" in sglang.info["tokenizer_labels"]
    assert SglangEngine.owns_metrics(scrape(engine))


def test_instant_values_and_runtime_facts(sglang: SglangProducer, engine: SglangEngine) -> None:
    cfg = engine.config
    sglang.call("constants", context_len=cfg.context_length)
    stats = {
        "num_running_reqs": 3,
        "num_queue_reqs": 2,
        "token_usage": 0.4375,
        "kv_used_tokens": 1792,
        "kv_evictable_tokens": 900,  # radix-cached, not held: not in kv_used_tokens
        "cache_hit_rate": 0.625,
        "gen_throughput": 41.5,
    }
    sglang.call("stats", stats=stats)
    families = scrape(engine)

    facts = SglangEngine.runtime_facts(families)
    assert facts["capacity_tokens"] == cfg.kv_capacity_tokens  # --max-total-tokens
    assert facts["block_size"] == cfg.page_size  # --page-size
    assert SglangEngine.capacity_tokens(families) == cfg.kv_capacity_tokens
    values = SglangEngine.kvscope_values(families)
    assert values["kv_capacity_tokens"] == cfg.kv_capacity_tokens
    assert values["running_requests"] == stats["num_running_reqs"]
    assert values["queued_requests"] == stats["num_queue_reqs"]
    assert values["kv_usage"] == stats["token_usage"]
    assert values["kv_used_tokens"] == stats["kv_used_tokens"]
    assert values["cache_hit_rate"] == stats["cache_hit_rate"]
    assert values["gen_throughput"] == stats["gen_throughput"]


def test_counters_follow_what_was_fed(sglang: SglangProducer, engine: SglangEngine) -> None:
    reqs = requests(
        "counters",
        ("planner", 900, 0, 0),
        ("executor", 1200, 512, 128),
        ("planner", 1400, 880, 0),
        ("reviewer", 700, 448, 64),  # total only, no per-tier details
        ("executor", 1000, 0, 0),
    )
    before = SglangEngine.counters(scrape(engine))
    send(sglang, engine, reqs)
    evicted = sglang.call("evict", tokens=96)["evicted"]
    after = SglangEngine.counters(scrape(engine))

    def delta(name: str) -> float:
        return (after[name] or 0.0) - (before[name] or 0.0)

    assert evicted == 96  # RadixCache.evict freed the whole 96-token leaf
    assert delta("prompt_tokens_total") == sum(r.prompt_tokens for r in reqs)
    assert delta("cached_tokens_total") == sum(r.cached_tokens for r in reqs)
    assert delta("generation_tokens_total") == sum(r.completion_tokens for r in reqs)
    assert delta("evicted_tokens_total") == evicted


def test_latency_histograms(sglang: SglangProducer, engine: SglangEngine) -> None:
    reqs = requests("latency", ("planner", 800, 0, 0), ("executor", 900, 64, 0))
    reqs += requests("latency", ("planner", 950, 320, 32), ("reviewer", 600, 0, 0))
    before = histogram_parts(scrape(engine))
    send(sglang, engine, reqs)
    after = histogram_parts(scrape(engine))

    fed = {
        "ttft_seconds": [r.ttft_s for r in reqs],
        "e2e_seconds": [r.e2e_s for r in reqs],
        "queue_seconds": [r.queue_s for r in reqs],
        # only the prefill_forward stage: request_process (dispatch_s) shares the family
        "prefill_seconds": [r.prefill_s for r in reqs],
    }
    assert set(SglangEngine.latency_histograms) == set(fed)  # decode: not observed by SGLang
    for name, seconds in fed.items():
        count = after[(name, "count")] - before[(name, "count")]
        total = after[(name, "sum")] - before[(name, "sum")]
        assert count == len(seconds), name
        assert total == pytest.approx(sum(seconds), abs=1e-6), name


def scraper(engine: SglangEngine, interval_s: float) -> Sampler:
    url = engine.endpoints().metrics_url
    assert url is not None
    # A generous timeout: a scrape that times out on a busy machine would be a gap here.
    return Sampler(SglangEngine, url, "run", interval_s=interval_s, timeout_s=10)


def warm_up(sglang: SglangProducer, engine: SglangEngine) -> None:
    """An engine that has served a request: its per-agent series exist before a run starts
    (test_fresh_engine_first_requests_count is the other case)."""
    send(sglang, engine, requests("warm-up", ("planner", 700, 64, 0)))


def test_scraper_and_per_agent_view(sglang: SglangProducer, engine: SglangEngine) -> None:
    first = requests("view", ("planner", 1000, 0, 0), ("executor", 800, 0, 0))
    between = requests(
        "view",
        ("planner", 1500, 992, 0),
        ("executor", 1100, 640, 160),
        ("planner", 1700, 1408, 96),
        ("reviewer", 900, 512, 0),  # first seen between the two scrapes
    )
    send(sglang, engine, first)  # before the run: only the change after it counts
    run = scraper(engine, interval_s=600)  # one scrape in start(), one in stop(): no other
    run.start()
    send(sglang, engine, between)
    summary = run.stop()
    assert (summary.scrapes, summary.errors) == (2, 0)

    view = per_agent_server(run.table().to_pylist())
    expected = fed_per_agent(between)
    for agent, want in expected.items():
        assert view[agent] == pytest.approx(want, rel=1e-9), agent
    for agent in set(view) - set(expected):  # other tests' agents: nothing new
        assert view[agent]["prompt_tokens"] == 0, agent
    prompt = run.kvscope_series()["prompt_tokens_total"]
    assert counter_delta(v for _, v in prompt) == sum(r.prompt_tokens for r in between)


def test_agent_without_cache_hits_has_zero_cached(
    sglang: SglangProducer, engine: SglangEngine
) -> None:
    warm_up(sglang, engine)
    reqs = requests("cold", ("worker", 1300, 0, 0), ("worker", 1100, 0, 0))
    run = scraper(engine, interval_s=600)
    run.start()
    send(sglang, engine, reqs)
    run.stop()
    view = per_agent_server(run.table().to_pylist())
    assert view["cold-worker"]["prompt_tokens"] == 2400
    assert view["cold-worker"].get("cached_tokens") == 0


def test_fresh_engine_first_requests_count(sglang: SglangProducer, engine: SglangEngine) -> None:
    sglang.restart()  # freshly started: no request yet, so no prompt/cached/TTFT series
    reqs = requests("fresh", ("planner", 1300, 256, 0), ("executor", 900, 128, 32))
    run = scraper(engine, interval_s=600)
    run.start()
    send(sglang, engine, reqs)
    summary = run.stop()
    assert (summary.scrapes, summary.errors) == (2, 0)
    prompt = run.kvscope_series()["prompt_tokens_total"]
    assert [v for _, v in prompt] == [2200]  # SGLang had no such sample at the first scrape
    view = per_agent_server(run.table().to_pylist())
    for agent, want in fed_per_agent(reqs).items():
        assert view[agent] == pytest.approx(want, rel=1e-9), agent


def wait_sampled(run: Sampler, timeout_s: float = 30.0) -> None:
    """Until the scraper has recorded a scrape (start() gives up waiting after its timeout)."""
    deadline = time.monotonic() + timeout_s
    while run.summary().scrapes <= run.summary().errors:
        assert time.monotonic() < deadline, "no successful scrape"
        time.sleep(0.02)


def test_counter_reset_when_sglang_restarts(sglang: SglangProducer, engine: SglangEngine) -> None:
    warm_up(sglang, engine)
    before = requests("restart", ("planner", 1600, 704, 0), ("executor", 1200, 64, 0))
    after = requests("restart", ("planner", 500, 256, 0))  # fewer: the counter drops
    run = scraper(engine, interval_s=0.05)
    run.start()
    wait_sampled(run)
    send(sglang, engine, before)
    sglang.wait_scraped()  # the last value before the restart is in the series
    sglang.restart()  # a new SGLang process: counters start again from 0
    send(sglang, engine, after)
    sglang.wait_scraped()
    summary = run.stop()

    assert summary.errors >= 1  # the restart left a gap, and the scraper went on after it
    assert summary.errors == len(run.gaps) < summary.scrapes
    view = per_agent_server(run.table().to_pylist())
    for agent, want in fed_per_agent(before + after).items():
        assert view[agent] == pytest.approx(want, rel=1e-9), agent
    prompt = run.kvscope_series()["prompt_tokens_total"]
    assert counter_delta(v for _, v in prompt) == sum(r.prompt_tokens for r in before + after)
