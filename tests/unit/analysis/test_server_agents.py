"""SGLang's per-agent server view, from two real SGLang scrapes (recorded fixtures)."""

import json
import re

import pyarrow as pa
import pytest
from helpers import ROOT, SGLANG_FIXTURES

from kvscope.analysis.run import named_samples
from kvscope.analysis.server_agents import per_agent_server
from kvscope.analysis.time_split import histogram_sums
from kvscope.engines.detect import parse_metrics
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine

SCRAPES = ("metrics_tokenizer_and_scheduler.prom", "metrics_tokenizer_and_scheduler.later.prom")


def series_rows(engine: type, texts: list[str]) -> list[dict]:
    """Rows as the scraper writes them (metric_name, labels JSON, value, kvscope_name)."""
    rows = []
    for t, text in enumerate(texts):
        for family in parse_metrics(text):
            for s in family.samples:
                rows.append({
                    "timestamp_ns": t, "metric_name": s.name, "value": s.value,
                    "labels": json.dumps(s.labels, sort_keys=True),
                    "kvscope_name": engine.kvscope_name(s.name, s.labels),
                })  # fmt: skip
    return rows


def agent_total(text: str, sample: str, agent: str) -> float:
    pattern = rf'^{re.escape(sample)}\{{[^}}]*agent="{agent}"[^}}]*\}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, flags=re.M))


def test_sglang_agent_labels_over_the_run() -> None:
    before, after = [(SGLANG_FIXTURES / name).read_text() for name in SCRAPES]
    view = per_agent_server(series_rows(SglangEngine, [before, after]))
    assert set(view) == {"planner", "executor", "expresser", "reviewer"}
    for agent, got in view.items():
        for sample, column in (("sglang:cached_tokens_total", "cached_tokens"),
                               ("sglang:prompt_tokens_total", "prompt_tokens")):  # fmt: skip
            expected = agent_total(after, sample, agent) - agent_total(before, sample, agent)
            assert got[column] == pytest.approx(expected)
        s = "sglang:time_to_first_token_seconds"
        d_sum = agent_total(after, s + "_sum", agent) - agent_total(before, s + "_sum", agent)
        d_count = agent_total(after, s + "_count", agent) - agent_total(before, s + "_count", agent)
        assert d_count > 0
        assert got["ttft_mean_ms"] == pytest.approx(d_sum / d_count * 1000)


def test_vllm_has_no_per_agent_view() -> None:
    text = (ROOT / "tests" / "fixtures" / "vllm-0.32.0" / "metrics.prom").read_text()
    assert per_agent_server(series_rows(VllmEngine, [text, text])) == {}


def _row(ts: int, name: str, metric: str, agent: str | None, value: float) -> dict:
    labels = json.dumps({"agent": agent} if agent else {}, separators=(",", ":"))
    return {"timestamp_ns": ts, "kvscope_name": name, "metric_name": metric, "labels": labels,
            "value": value}  # fmt: skip


def test_fresh_engine_counts_from_the_first_scrape() -> None:
    # Scrape 1 (t=1) has no labelled series yet; the planner's counters appear at t=2.
    rows = [
        _row(1, "running_requests", "sglang:num_running_reqs", None, 0.0),
        _row(2, "prompt_tokens_total", "sglang:prompt_tokens_total", "planner", 1300.0),
        _row(2, "cached_tokens_total", "sglang:cached_tokens_total", "planner", 256.0),
    ]
    assert per_agent_server(rows) == {"planner": {"prompt_tokens": 1300.0, "cached_tokens": 256.0}}


def test_agent_without_hits_has_zero_cached_tokens() -> None:
    """SGLang creates an agent's cached_tokens_total series at its first hit: where the engine
    exports the counter (another agent has one), an agent without a series had no hit."""
    rows = [
        _row(1, "running_requests", "sglang:num_running_reqs", None, 0.0),
        _row(2, "prompt_tokens_total", "sglang:prompt_tokens_total", "worker", 2400.0),
        _row(2, "prompt_tokens_total", "sglang:prompt_tokens_total", "critic", 800.0),
        _row(2, "cached_tokens_total", "sglang:cached_tokens_total", "critic", 64.0),
    ]
    assert per_agent_server(rows)["worker"] == {"prompt_tokens": 2400.0, "cached_tokens": 0.0}


def test_cached_tokens_unknown_when_the_engine_never_exported_the_counter() -> None:
    rows = [
        _row(1, "running_requests", "sglang:num_running_reqs", None, 0.0),
        _row(2, "prompt_tokens_total", "sglang:prompt_tokens_total", "worker", 2400.0),
    ]
    assert per_agent_server(rows)["worker"] == {"prompt_tokens": 2400.0, "cached_tokens": None}


def test_a_series_without_a_known_value_is_unknown_not_zero() -> None:
    nan = float("nan")
    rows = [
        _row(1, "prompt_tokens_total", "sglang:prompt_tokens_total", "worker", nan),
        _row(2, "prompt_tokens_total", "sglang:prompt_tokens_total", "worker", nan),
        _row(2, "cached_tokens_total", "sglang:cached_tokens_total", "worker", 10.0),
    ]
    assert per_agent_server(rows)["worker"]["prompt_tokens"] is None


def test_the_named_samples_give_the_same_views_as_every_row() -> None:
    """analyze_run hands the analyses only the rows kvscope names and the run's first sample
    (a 100k-call run: 250k rows of 3.4 M): the same per-agent view and time split, also where
    the first scrape has only unnamed samples (a counter first seen later starts at 0 there)."""
    before, after = [(SGLANG_FIXTURES / name).read_text() for name in SCRAPES]
    rows = series_rows(SglangEngine, [before, after])
    unnamed_first = {"timestamp_ns": -5, "metric_name": "process_cpu_seconds_total",
                     "labels": "{}", "value": 1.0, "kvscope_name": None}  # fmt: skip
    for every in (rows, [unnamed_first, *rows]):
        table = pa.Table.from_pylist(every)
        named = named_samples(table)
        assert len(named) < len(every)
        assert min(r["timestamp_ns"] for r in named) == min(r["timestamp_ns"] for r in every)
        assert per_agent_server(named) == per_agent_server(every)
        assert histogram_sums(named) == histogram_sums(every)
    shifted = per_agent_server([unnamed_first, *rows])  # from -5: every counter's own first value
    assert shifted != per_agent_server(rows)
