"""report.html and compare.html from hand-made run directories: sections, numbers, no gaps."""

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from request_tables import MS, request

from kvscope.analysis.run import analyze_run
from kvscope.records import requests
from kvscope.records.run_dir import RUN_JSON
from kvscope.report.pages import compare_report, run_report
from kvscope.report.run_sections import run_sections
from kvscope.report.table import NULL

AGENTS = ("planner", "executor", "expresser", "reviewer")


def workflow_rows(wf: str, hits: dict[str, tuple[int, int]], t0: int = 0) -> list[dict]:
    """One PEER cycle: agent -> (prompt, cached); 1 s per call, 100 ms gaps."""
    rows, prev = [], None
    for i, agent in enumerate(AGENTS):
        prompt, cached = hits[agent]
        start = t0 + i * 1100
        rows.append(
            request(
                workflow_run_id=wf,
                thread_id=wf,
                agent_id=agent,
                previous_agent_id=prev,
                start_ns=start * MS,
                end_ns=(start + 1000) * MS,
                prompt_tokens=prompt,
                cached_tokens=cached,
                ttft_ms=100.0 + prompt / 10,
                queue_ms=1.0,
                e2e_ms=1000.0,
                prompt_layout="shared-first",
            )
        )
        prev = agent
    return rows


# The design note's examples: per agent 1000 / 6000 / 500 / 2000 recomputed (9500 in all);
# the planner's two calls are 100/90 and 10000/1000: 1090 / 10100 = 10.8%.
HITS_W0 = {
    "planner": (100, 90),
    "executor": (8000, 2000),
    "expresser": (5000, 4500),
    "reviewer": (3000, 1000),
}
HITS_W1 = {
    "planner": (10_000, 1000),
    "executor": (400, 0),
    "expresser": (300, 0),
    "reviewer": (200, 100),
}


def make_run(
    path: Path,
    capacity: int | None = None,
    rows: list[dict] | None = None,
    blocks: pa.Table | None = None,
) -> Path:
    path.mkdir(parents=True)
    rows = rows or workflow_rows("w0", HITS_W0) + workflow_rows("w1", HITS_W1, t0=10_000)
    requests.write_table(path, rows)
    config: dict[str, Any] = {
        "engine": {"kind": "vllm", "kv_capacity_tokens": capacity},
        "workload": {"workflows": 2, "concurrency": 1, "layout": "shared-first"},
        "tracking": {"tracking_uri": None, "experiment": "x"},
    }
    (path / RUN_JSON).write_text(json.dumps({"benchmark_run_id": path.name, "config": config}))
    if blocks is not None:
        pq.write_table(blocks, path / "blocks.parquet")
    return path


def images(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


def test_run_report_sections_numbers_and_missing_data(tmp_path: Path) -> None:
    out = run_report(make_run(tmp_path / "run-a"))
    assert out == tmp_path / "run-a" / "report.html"
    html = out.read_text()
    for title in (
        "RQ1: per agent",
        "RQ2: transitions",
        "Next-agent predictability",
        "RQ6: where workflow time goes",
        "TTFT vs new prefill tokens",
        "KV usage over time",
        "Evictions",
    ):
        assert f"<h2>{title}</h2>" in html
    # planner: (90 + 1000) / (100 + 10000)
    assert ">10.8%<" in html
    # no data, no plot: a sentence instead
    assert "No KV events recorded for this run" in html
    assert "No /metrics series were recorded" in html
    assert "Level-3 provenance" in html  # says the provenance was not measured
    # self-contained: every image is embedded, nothing is fetched
    srcs = images(html)
    # agents, transitions, predictability, latency, TTFT (one turn: no turn plot)
    assert len(srcs) == 5
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "<script" not in html and "<link" not in html and "http" not in html


def test_sections_skip_empty_views(tmp_path: Path) -> None:
    data = analyze_run(make_run(tmp_path / "run-a"))
    sections = {s.key: s for s in run_sections(data)}
    # every workflow ran each agent once, turn 1: no turn-to-turn plot, a sentence instead
    assert sections["turns"].image is None and "Only one turn" in sections["turns"].missing
    for key in ("agents", "transitions", "latency", "ttft"):
        assert sections[key].image is not None, key
    recompute = sections["agents"].tables[0]
    burden = dict(
        zip(
            [r[0] for r in recompute.rows],
            [r[recompute.headers.index("recompute burden")] for r in recompute.rows],
            strict=True,
        )
    )
    assert burden == {
        "planner": "9,010",
        "executor": "6,400",
        "expresser": "800",
        "reviewer": "2,100",
    }
    latency = sections["latency"]
    assert any("Cache-miss cost is not shown" in n for n in latency.notes)
    headers = latency.tables[0].headers
    assert "cache-miss cost" not in headers  # null in every row: left out, not shown as 0
    assert "queue" in headers


def test_null_values_show_as_not_measured(tmp_path: Path) -> None:
    rows = workflow_rows("w0", HITS_W0)
    rows[1]["cached_tokens"] = None  # the executor's only call: not measured
    data = analyze_run(make_run(tmp_path / "run-n", rows=rows))
    table = next(s for s in run_sections(data) if s.key == "agents").tables[0]
    executor = next(r for r in table.rows if r[0] == "executor")
    assert executor[table.headers.index("weighted hit")] == NULL
    assert executor[table.headers.index("recompute burden")] == NULL


def blocks_table() -> pa.Table:
    return pa.table(
        {
            "block_hash": [1, 2, 3, 4],
            "owner_agent_id": ["expresser", "expresser", "planner", "planner"],
            "owner_workflow_run_id": ["w0", "w0", "w1", "w0"],
            "evictor_agent_id": ["executor", "executor", "executor", None],
            "evictor_workflow_run_id": ["w0", "w1", "w0", None],
            "harmful": [True, True, False, False],
            "recomputed_tokens": [16, 16, None, None],
            "residency_ms": [100.0, 300.0, 50.0, None],
            "removed_ns": [1, 2, 3, None],  # block 4 was never removed
        }
    )


def test_eviction_heatmap_from_blocks(tmp_path: Path) -> None:
    data = analyze_run(make_run(tmp_path / "run-b", blocks=blocks_table()))
    section = next(s for s in run_sections(data) if s.key == "evictions")
    assert section.image is not None
    (view,) = section.tables
    got = {(r[0], r[1]): r for r in view.rows}
    assert set(got) == {("executor", "planner"), ("executor", "expresser")}
    row = got[("executor", "expresser")]
    assert row[view.headers.index("blocks evicted")] == "2"
    assert row[view.headers.index("same workflow")] == "1"
    assert row[view.headers.index("harmful")] == "2"
    assert row[view.headers.index("recomputed tokens")] == "32"
    assert row[view.headers.index("residency p50 ms")] == "200"
    assert got[("executor", "planner")][view.headers.index("recomputed tokens")] == NULL


def test_compare_report_names_the_agent_that_loses_reuse_first(tmp_path: Path) -> None:
    big = make_run(tmp_path / "cap-8192", capacity=8192)
    # at 2048 tokens the executor keeps 0 of 8400 (was 2000 / 8400: below 90%), others hold
    small_hits = [
        workflow_rows("w0", HITS_W0 | {"executor": (8000, 0)}),
        workflow_rows("w1", HITS_W1, t0=10_000),
    ]
    small = make_run(tmp_path / "cap-2048", capacity=2048, rows=small_hits[0] + small_hits[1])
    out = compare_report([big, small], tmp_path / "out" / "compare.html")
    html = out.read_text()
    assert "executor loses reuse first" in html
    assert "23.8% at 8,192 tokens to 0.0% at 2,048 tokens" in html
    for title in ("RQ3: prompt layout", "RQ4: cache pressure", "RQ5: sharing modes"):
        assert f"<h2>{title}</h2>" in html
    # each per-run view, side by side, under a short label (the shared "cap-" is dropped)
    assert html.count('class="runlabel">8192<') == 10
    assert all(s.startswith("data:image/png;base64,") for s in images(html))


def test_compare_without_capacity_difference_says_so(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    html = compare_report([a, b], tmp_path / "c.html").read_text()
    assert "do not differ in KV capacity or concurrency: nothing to compare" in html
    assert "loses reuse first" not in html
    assert "do not differ in prompt layout" in html and "do not differ in sharing mode" in html


def test_not_a_run_directory(tmp_path: Path) -> None:
    from kvscope.errors import KvscopeError

    with pytest.raises(KvscopeError, match="not a kvscope run directory"):
        run_report(tmp_path)


def test_sweep_groups_name_what_else_differs(tmp_path: Path) -> None:
    from kvscope.report.compare_sections import sweep_groups

    runs = [analyze_run(make_run(tmp_path / n)) for n in ("a", "b", "c")]
    assert sweep_groups(runs) == [None, None, None]
    configs = [
        {"workload": {"layout": "shared-first", "sharing": "documents"}},
        {"workload": {"layout": "role-first", "sharing": "documents"}},
        {"workload": {"layout": "shared-first"}},  # an older run: no sharing setting recorded
    ]
    runs = [replace(run, run={"config": config}) for run, config in zip(runs, configs, strict=True)]
    assert sweep_groups(runs) == ["layout=shared-first", "layout=role-first", "layout=shared-first"]


def test_provenance_section(tmp_path: Path) -> None:
    plain = run_report(make_run(tmp_path / "plain")).read_text()
    assert "RQ1: who the cache served" in plain and "No KV events were recorded" in plain
    rows = workflow_rows("w0", HITS_W0)
    for r in rows:  # as finalize fills them: cached tokens by owner, the rest by cause
        r |= dict.fromkeys(
            ("cached_cross_agent_tokens", "cached_cross_workflow_tokens",
             "cached_unattributed_tokens", "uncached_evicted_tokens", "uncached_layout_tokens"),
            0,
        )  # fmt: skip
        r["cached_self_tokens"] = r["cached_tokens"]
        r["uncached_cold_tokens"] = r["prompt_tokens"] - r["cached_tokens"]
    html = run_report(make_run(tmp_path / "prov", rows=rows)).read_text()
    assert "No KV events were recorded" not in html
    section = html[html.index("<h2>RQ1: who the cache") : html.index("<h2>RQ2: transitions")]
    assert len(images(section)) == 1
    planner = [r for r in rows if r["agent_id"] == "planner"]
    assert f">{sum(r['cached_tokens'] for r in planner):,}<" in section


def test_rq6_says_where_the_call_overhead_sits(tmp_path: Path) -> None:
    from test_time_split import histogram

    from kvscope.records.metrics import SCHEMA

    run = make_run(tmp_path / "run-t")
    # 8 calls, TTFT 3,500 ms by the client (100 ms + prompt / 10 each); the engine: 3.2 s
    series = [
        *histogram("ttft_seconds", "vllm:time_to_first_token_seconds",
                   [(1, [(0, 0.0)]), (2, [(8, 3.2)])]),
        *histogram("e2e_seconds", "vllm:e2e_request_latency_seconds",
                   [(1, [(0, 0.0)]), (2, [(9, 7.5)])]),  # a ninth request: not this table's
    ]  # fmt: skip
    rows = [r | {"benchmark_run_id": "run-t"} for r in series]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), run / "metrics.parquet")
    html = run_report(run).read_text()
    assert "TTFT summed over 8 calls: the client&#39;s 3.5 s = the engine&#39;s 3.2 s" in html
    assert "+ 0.3 s on the client&#39;s side" in html
    assert "the engine counted 9 requests, the table has 8 measured calls" in html


def test_a_large_runs_per_workflow_table_keeps_its_longest_critical_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvscope.report import run_sections as sections

    slow = [r | {"end_ns": r["end_ns"] + 3000 * MS, "e2e_ms": 4000.0, "ttft_ms": 3000.0}
            for r in workflow_rows("w1", HITS_W1, t0=10_000)]  # fmt: skip
    run = analyze_run(make_run(tmp_path / "run-w", rows=workflow_rows("w0", HITS_W0) + slow))
    paths = dict(zip(*run.workflows.select(["workflow_run_id", "critical_path_ms"]).to_pydict()
                     .values(), strict=True))  # fmt: skip
    assert paths["w0"] != paths["w1"]
    longest = max(paths, key=lambda w: paths[w])

    def per_workflow() -> Any:
        latency = next(s for s in run_sections(run) if s.key == "latency")
        return next(t for t in latency.tables if t.title.startswith("per workflow"))

    whole = per_workflow()
    assert whole.title == "per workflow: all calls and its critical path (ms)"
    assert [r[0] for r in whole.rows] == ["w0", "w1"]
    monkeypatch.setattr(sections, "WORKFLOW_ROWS", 1)
    bounded = per_workflow()
    assert bounded.title.startswith("per workflow: the 1 of 2 with the longest critical path")
    assert [r[0] for r in bounded.rows] == [longest]
