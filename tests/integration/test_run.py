"""`kvscope run` on the real engine: the request table, the MLflow run and its traces."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import mlflow
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import KVSCOPE, ROOT, Up, free_port

from kvscope.records.requests import COLUMNS

pytestmark = pytest.mark.engine
AGENTS = ["planner", "executor", "expresser", "reviewer"]


def experiment(up: Up, tmp_path: Path, **workload: Any) -> Path:
    """The shipped demo config, on the session's engine (so `run` reuses it)."""
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["engine"] = up.engine_config
    cfg["workload"].update(workload)
    cfg["runs_dir"] = str(tmp_path / "runs")
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def demo(up: Up, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("demo")
    result = up.cli("run", str(experiment(up, tmp)), timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = [p for p in (tmp / "runs").iterdir() if p.is_dir() and p.name.startswith("demo-")]
    return {"stdout": result.stdout, "run_dir": run_dir, "runs": tmp / "runs"}


def test_one_row_per_call_with_every_column(demo: dict[str, Any]) -> None:
    table = pq.read_table(demo["run_dir"] / "requests.parquet")
    assert table.column_names == list(COLUMNS)
    rows = table.to_pylist()
    cfg = yaml.safe_load((demo["run_dir"] / "config.yaml").read_text())["workload"]
    assert len(rows) == cfg["workflows"] * cfg["cycles"] * 4
    assert all(r["status"] == "ok" for r in rows)
    assert len({r["request_uuid"] for r in rows}) == len(rows)
    # each call's end ran on the background thread (probe/background.py), none on the app's
    capture = json.loads((demo["run_dir"] / "run.json").read_text())["capture"]
    assert capture["background"] == {"queued": len(rows), "inline": 0, "failed": 0}
    for r in rows:
        assert r["sglang_response_id"] == f"chatcmpl-{r['request_uuid']}"  # vLLM echoes it
        assert r["prompt_tokens"] > 0 and r["cached_tokens"] is not None
        assert r["ttft_ms"] is not None and r["e2e_ms"] >= r["ttft_ms"]
        assert (r["tool_ms"] is not None) == (r["agent_id"] == "executor")
        # Level 2: the engine's own timing and the server context around the call
        assert r["queue_ms"] is not None and r["prefill_ms"] is not None
        assert r["decode_ms"] is not None
        for column in (
            "cache_used_tokens_before",
            "cache_used_tokens_after",
            "cache_utilization_before",
            "running_requests",
            "queued_requests",
        ):
            assert r[column] is not None, column  # fmt: skip


def test_identifiers_and_reuse_across_cycles(demo: dict[str, Any]) -> None:
    rows = pq.read_table(demo["run_dir"] / "requests.parquet").to_pylist()
    by_thread: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["start_ns"]):
        by_thread.setdefault(r["thread_id"], []).append(r)
    for calls in by_thread.values():
        assert [c["agent_id"] for c in calls] == AGENTS * 2
        assert [c["previous_agent_id"] for c in calls] == [
            None,
            *[c["agent_id"] for c in calls[:-1]],
        ]
        assert [c["turn_id"] for c in calls] == [1] * 4 + [2] * 4
        assert len({c["workflow_run_id"] for c in calls}) == 1
        planner2 = calls[4]
        assert planner2["agent_id"] == "planner" and planner2["turn_id"] == 2
        assert planner2["cached_tokens"] > 0  # its own prefix from cycle 1


def test_traces_one_per_workflow_with_agent_and_llm_spans(demo: dict[str, Any]) -> None:
    rows = pq.read_table(demo["run_dir"] / "requests.parquet").to_pylist()
    run_json = json.loads((demo["run_dir"] / "run.json").read_text())
    mlflow.set_tracking_uri(f"sqlite:///{demo['runs'] / 'mlflow.db'}")
    (run,) = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=f"tags.benchmark_run_id = '{run_json['benchmark_run_id']}'",
        output_format="list",
    )
    assert run.data.metrics["traces_dropped"] == 0
    assert run.data.params["serving_engine"] == "vllm"
    assert "planner.weighted_hit_ratio" in run.data.metrics
    traces = mlflow.search_traces(
        locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list"
    )
    workflows = {r["workflow_run_id"] for r in rows}
    assert len(traces) == len(workflows)
    llm_uuids = []
    for trace in traces:
        spans = trace.data.spans
        children = {s.span_id: [c for c in spans if c.parent_id == s.span_id] for s in spans}
        root = next(s for s in spans if s.parent_id is None)
        agents = sorted(children[root.span_id], key=lambda s: s.start_time_ns)
        assert [a.name for a in agents] == AGENTS * 2
        for agent in agents:
            llm = [s for s in children[agent.span_id] if s.span_type == "LLM"]
            assert len(llm) == 1
            assert llm[0].attributes["agent.id"] == agent.name
            llm_uuids.append(llm[0].attributes["request.uuid"])
        assert trace.info.trace_metadata["mlflow.trace.session"] in {r["thread_id"] for r in rows}
    assert sorted(llm_uuids) == sorted(r["request_uuid"] for r in rows)


def test_server_series_reconciliation_and_plot(demo: dict[str, Any]) -> None:
    run_dir = demo["run_dir"]
    series = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    times = sorted({s["timestamp_ns"] for s in series})
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    workload_s = (max(r["end_ns"] for r in rows) - min(r["start_ns"] for r in rows)) / 1e9
    scrape = json.loads((run_dir / "metrics.gaps.json").read_text())["summary"]
    assert len(times) >= 4 * workload_s, scrape  # at least 4 samples per second of workload
    names = {s["metric_name"] for s in series}
    assert {
        "kvscope:kv_used_tokens",
        "kvscope:running_requests",
        "vllm:prompt_tokens_total",
    } <= names
    summary = json.loads((run_dir / "summary.json").read_text())
    recon = {r["counter"]: r for r in summary["reconciliation"]}
    for counter in ("prompt_tokens_total", "cached_tokens_total"):
        assert recon[counter]["difference"] == 0, recon[counter]  # exact agreement
    assert summary["server"]["kv_used_tokens_peak"] > 0
    # The engine's front-end histograms count exactly this run's calls, and nest the core's
    # parts inside them, inside the client's own span.
    ok = [r for r in rows if r["status"] == "ok"]
    for split in summary["time_split"]:
        assert split["matched"] and split["engine_requests"] == split["rows"] == len(ok), split
        assert split["client_ms"] >= split["engine_ms"] >= split["core_ms"] > 0, split
    assert {s["span"] for s in summary["time_split"]} == {"ttft", "e2e"}
    printed = " ".join(demo["stdout"].split())  # the terminal wraps long sentences
    assert "TTFT summed over" in printed and "its front end" in printed
    png = run_dir / "timeline.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    assert "reconcile cached_tokens_total" in demo["stdout"] and "exact" in demo["stdout"]


def test_prompt_instrumentation_and_provenance(demo: dict[str, Any]) -> None:
    rows = pq.read_table(demo["run_dir"] / "requests.parquet").to_pylist()
    for r in rows:
        # kvscope's own tokenization of the prompt agrees with the engine's count.
        assert r["token_id_hash"] and r["prompt_hash"]
        assert 0 < r["fixed_prefix_tokens"] < r["prompt_tokens"]
        assert r["dynamic_suffix_tokens"] == r["prompt_tokens"] - r["fixed_prefix_tokens"]
        assert r["raw_messages_json"] is None  # opt-in
        assert r["cached_self_tokens"] is not None, r
        assert r["max_reusable_tokens"] is not None
    # shared-first: the Executor reuses the prefix the Planner stored just before it.
    executors = [r for r in rows if r["agent_id"] == "executor"]
    assert all(r["first_divergence_previous_agent"] > 100 for r in executors)
    assert sum(r["cached_cross_agent_tokens"] for r in executors) > 0
    for name in ("kv_events.parquet", "blocks.parquet", "kv_events.summary.json"):
        assert (demo["run_dir"] / name).exists()
    assert "where each agent's prompt tokens came from" in demo["stdout"]


def test_run_on_a_shared_engine_keeps_its_log_excerpt(demo: dict[str, Any]) -> None:
    # The session's engine was started by `kvscope engine up`: the run keeps what it logged.
    text = (demo["run_dir"] / "engine.log").read_text()
    assert text.startswith("# ") and "kvscope engine up" in text.splitlines()[0]
    calls = text.count("POST /v1/chat/completions")
    # The run's 32 calls and detection's probe; not the earlier tests' calls on this engine.
    assert 32 <= calls < 40


def test_summary_printed(demo: dict[str, Any]) -> None:
    out = demo["stdout"]
    for agent in AGENTS:
        assert agent in out
    assert "weighted hit" in out and "traces: 4 written of 4 workflows" in out
    assert str(demo["run_dir"]) in out.replace("\n", "")


def test_killed_run_keeps_every_finished_call(up: Up, tmp_path: Path) -> None:
    path = experiment(up, tmp_path, workflows=2, cycles=3)
    proc = subprocess.Popen([*KVSCOPE, "run", str(path)], env=up.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        jsonl = None
        while time.monotonic() < deadline:
            found = list((tmp_path / "runs").glob("demo-*/requests.jsonl"))
            if found and len(found[0].read_text().splitlines()) >= 3:
                jsonl = found[0]
                break
            time.sleep(0.5)
        assert jsonl is not None, "no calls recorded in time"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = jsonl.read_text().splitlines()
    assert not (jsonl.parent / "requests.parquet").exists()
    result = up.cli("convert", str(jsonl.parent))
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(jsonl.parent / "requests.parquet").to_pylist()
    complete = [json.loads(line) for line in lines if line.endswith("}")]
    assert len(rows) == len(complete) >= 3
    assert [r["request_uuid"] for r in rows] == [c["request_uuid"] for c in complete]
    # The streams written while the run went give the crashed run its Level 2 and 3 columns.
    for r in rows:
        assert r["cache_used_tokens_before"] is not None and r["running_requests"] is not None
        assert r["token_id_hash"] is not None and r["cached_self_tokens"] is not None
    assert (jsonl.parent / "blocks.parquet").exists()
    assert "/metrics context on" in result.stdout


def test_mlflow_down_the_run_completes_locally_and_logs_later(up: Up, tmp_path: Path) -> None:
    """An MLflow server that does not answer: a warning in seconds, before the engine is used;
    the run completes and is written in full; `kvscope log RUN` then uploads it to a store."""
    path = experiment(up, tmp_path, workflows=1, cycles=1)
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    result = up.cli("run", str(path), "--tracking-uri", dead, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MLflow" in result.stderr and "unreachable" in result.stderr
    assert "kvscope log" in result.stdout
    assert time.monotonic() - t0 < 240  # no minutes of MLflow retries (the run itself: ~1 min)
    (run_dir,) = (tmp_path / "runs").glob("demo-*")
    assert (run_dir / "report.html").exists() and (run_dir / "summary.json").exists()
    assert json.loads((run_dir / "run.json").read_text())["mlflow"]["logged"] is False
    store = f"sqlite:///{tmp_path / 'later.db'}"
    logged = up.cli("log", str(run_dir), "--tracking-uri", store)
    assert logged.returncode == 0 and "logged as MLflow run" in logged.stdout, logged.stderr
    mlflow.set_tracking_uri(store)
    [run] = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.data.tags["kvscope.status"] == "complete" and run.data.metrics["all.calls"] == 4
