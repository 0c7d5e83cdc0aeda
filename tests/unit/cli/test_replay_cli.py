"""`kvscope replay` on the recorded pathology run and on traces: tables, fidelity, --json,
replay.json/png in the run directory and in its report, clear errors."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import ROOT
from typer.testing import CliRunner

from kvscope.cli import app
from kvscope.sim.inputs.convert import mooncake_rows, write_jsonl
from kvscope.sim.inputs.sources import load_source

PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology"
runner = CliRunner()


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return shutil.copytree(PATHOLOGY, tmp_path / "run")


def test_replay_of_a_run_prints_results_and_fidelity_and_writes_its_files(
    run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out" / "replay.json"
    args = ["replay", str(run), "--capacity-tokens", "2048,3456,4096", "--json", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = result.output
    for piece in (
        "per policy and capacity",
        "per agent",
        "per transition",
        "evictor -> victim",
        "Replay fidelity",
        "weighted difference",
        "reviewer -> planner",
        "ms/token on prefill_ms",
        "not logged to MLflow",
    ):
        assert piece in text, piece
    assert "skipped: not in this simulator yet" in text or "belady" in text
    rows = json.loads(out.read_text())
    assert [r["capacity_tokens"] for r in rows if r["policy"] == "lru"] == [2048, 3456, 4096]
    first = rows[0]
    for key in (
        "policy",
        "capacity_tokens",
        "requests",
        "prompt_tokens",
        "cached_tokens",
        "hit_ratio",
        "per_agent",
        "seconds",
    ):
        assert key in first
    assert set(first["per_agent"]["planner"]) >= {"prompt_tokens", "cached_tokens"}
    doc = json.loads((run / "replay.json").read_text())
    assert doc["kind"] == "run" and doc["fidelity"]["compared"] == 12
    assert (run / "replay.png").read_bytes()[:4] == b"\x89PNG"


def test_the_report_shows_the_replay_when_the_run_has_one(run: Path) -> None:
    assert runner.invoke(app, ["replay", str(run), "--no-mlflow"]).exit_code == 0
    result = runner.invoke(app, ["report", str(run), "--no-mlflow"])
    assert result.exit_code == 0, result.output
    html = (run / "report.html").read_text()
    assert "What-if replay" in html and "Replay fidelity" in html


def test_no_write_leaves_the_run_directory_alone(run: Path) -> None:
    result = runner.invoke(app, ["replay", str(run), "--no-write"])
    assert result.exit_code == 0, result.output
    assert not (run / "replay.json").exists()


def test_a_mooncake_trace_replays_without_fidelity(tmp_path: Path) -> None:
    source = load_source(PATHOLOGY)
    trace = write_jsonl(mooncake_rows(source), tmp_path / "m.jsonl")
    # the run's own 27 blocks: the Mooncake replay gives what the engine measured
    measured = source.trace.measured_cached_tokens
    assert measured is not None
    expected = f"{measured.sum() / source.trace.prompt_tokens.sum():.1%}"
    args = ["replay", str(trace), "--block-size", "128", "--capacity-tokens", "3456"]
    result = runner.invoke(app, [*args, "--policy", "lru", "--cache-outputs"])
    assert result.exit_code == 0, result.output
    assert expected in result.output and "fidelity" not in result.output
    assert "caching: cache-outputs (the engine's own)" in result.output
    assert "no prefill cost could be fitted" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "unknown policy 'nope'; known: lru"),
        (["--capacity-tokens", "lots"], "--capacity-tokens takes integers"),
        (["--policy", "priority-hints"], "the vLLM block pool has no per-request priority"),
    ],
)
def test_bad_options_are_one_line_errors(run: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["replay", str(run), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_a_trace_needs_its_block_size_and_capacity(tmp_path: Path) -> None:
    trace = write_jsonl([{"request_id": "a", "token_ids": [1, 2]}], tmp_path / "t.jsonl")
    result = runner.invoke(app, ["replay", str(trace)])
    assert result.exit_code == 2 and "--block-size" in result.output
    result = runner.invoke(app, ["replay", str(trace), "--block-size", "1"])
    assert result.exit_code == 2 and "--capacity-tokens" in result.output


def _numbers(rows: list[dict]) -> list[dict]:
    """The results without what depends on the source kind (timings, measured-only values)."""
    return [{k: v for k, v in r.items() if k not in ("seconds", "ttft_saved_ms")} for r in rows]


@pytest.mark.parametrize("tokens_as", [".jsonl", ".arrow"])
def test_the_run_exported_as_both_trace_formats_replays_to_the_same_json(
    run: Path, tmp_path: Path, tokens_as: str
) -> None:
    moon, toks = tmp_path / "m.jsonl", tmp_path / f"t{tokens_as}"
    sweep = ["--policy", "lru", "--capacity-tokens", "2048,3456,4096"]
    args = ["replay", str(run), *sweep, "--no-write", "--json", str(tmp_path / "run.json")]
    result = runner.invoke(app, [*args, "--to-mooncake", str(moon), "--to-tokens", str(toks)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "run.json").read_text())
    assert len(rows) == 3 and all(r["ttft_saved_ms"] is not None for r in rows)
    want = _numbers(rows)
    for trace in (moon, toks):
        out = tmp_path / f"{trace.stem}.out.json"
        args = ["replay", str(trace), "--block-size", "128", *sweep, "--json", str(out)]
        args.append("--cache-outputs")  # the run's default; a trace's is --prompt-only
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        got = json.loads(out.read_text())
        assert _numbers(got) == want, trace.name
        assert all(r["ttft_saved_ms"] is None for r in got)  # nothing measured: null, not 0


def test_a_token_id_export_needs_a_run_directory(tmp_path: Path) -> None:
    trace = write_jsonl(mooncake_rows(load_source(PATHOLOGY)), tmp_path / "m.jsonl")
    args = ["replay", str(trace), "--block-size", "128", "--capacity-tokens", "3456"]
    result = runner.invoke(app, [*args, "--to-tokens", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2 and "--to-tokens needs a run directory" in result.output


def test_a_replay_without_harmful_evictions_says_so(run: Path) -> None:
    result = runner.invoke(app, ["replay", str(run), "--capacity-tokens", "65536", "--no-write"])
    assert result.exit_code == 0, result.output
    assert "harmful evictions: none in any replay" in result.output


def test_a_run_with_an_mlflow_run_gets_replay_json_and_png_logged(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from kvscope.probe.tracing import local_store_uri

    runs_dir = tmp_path / "runs"
    run = shutil.copytree(PATHOLOGY, runs_dir / "pathology")
    bench = json.loads((run / "run.json").read_text())["benchmark_run_id"]
    client = MlflowClient(local_store_uri(runs_dir))
    exp = client.create_experiment("x", artifact_location=(runs_dir / "mlartifacts").as_uri())
    run_id = client.create_run(exp, tags={"benchmark_run_id": bench}).info.run_id
    result = runner.invoke(app, ["replay", str(run)])
    assert result.exit_code == 0, result.output
    assert f"logged to MLflow run {run_id}" in result.output
    logged = {a.path for a in client.list_artifacts(run_id)}
    assert {"replay.json", "replay.png"} <= logged


def test_a_host_tier_splits_each_agents_tokens_and_prices_the_loads(
    run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "tiers.json"
    args = ["replay", str(run), "--policy", "lru", "--json", str(out), "--no-write"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    (one,) = json.loads(out.read_text())
    assert "tiers" not in one
    tiered = runner.invoke(app, [*args, "--host-tokens", "4096", "--host-load-ms", "2"])
    assert tiered.exit_code == 0, tiered.output
    assert "two tiers" in tiered.output
    (two,) = json.loads(out.read_text())
    tiers = two["tiers"]
    assert two["cached_tokens"] == one["cached_tokens"]  # here the device hits as without
    assert tiers["host_tokens"] > 0  # what LRU evicted comes back from the host
    for agent, t in tiers["per_agent"].items():
        prompt = two["per_agent"][agent]["prompt_tokens"]
        assert t["device_tokens"] == two["per_agent"][agent]["cached_tokens"]
        assert t["device_tokens"] + t["host_tokens"] + t["missed_tokens"] == prompt
        assert t["prefetched_tokens"] == 0  # no --prefetch
        assert t["load_ms"] == pytest.approx(2 * t["host_tokens"] / 128)
    assert two["recompute_tokens"] == one["recompute_tokens"] - tiers["host_tokens"]
    assert tiers["load_ms"] == pytest.approx(2 * tiers["host_tokens"] / 128)
    fetched = runner.invoke(app, [*args, "--host-tokens", "4096", "--prefetch"])
    assert fetched.exit_code == 0, fetched.output
    (three,) = json.loads(out.read_text())
    assert 0 < three["tiers"]["prefetched_tokens"] <= three["tiers"]["host_tokens"]
    assert three["tiers"]["load_ms"] is None and three["ttft_saved_ms"] is None  # no load cost


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefetch"], "need a host tier"),
        (["--host-tokens", "100"], "less than one block of 128"),
        (["--host-tokens", "1024", "--host-load-ms", "-1"], "must be >= 0"),
    ],
)
def test_bad_host_tier_options_are_one_line_errors(
    run: Path, args: list[str], message: str
) -> None:
    result = runner.invoke(app, ["replay", str(run), "--no-write", *args])
    assert result.exit_code == 2 and message in result.output


def test_an_error_line_is_printed_intact_line_number_and_brackets(tmp_path: Path) -> None:
    good = json.dumps({"request_id": "a", "token_ids": [1, 2]})
    trace = tmp_path / "t.jsonl"
    trace.write_text(good + "\n" * 99 + "{oops\n")  # line 100: ":100:" is an emoji to rich
    result = runner.invoke(app, ["replay", str(trace), "--block-size", "1"])
    assert result.exit_code == 2
    assert f"{trace}:100: not JSON" in result.output.replace("\n", "")
    trace.write_text(good + "\n" + json.dumps({"request_id": "b", "token_ids": ["[bold]x"]}))
    result = runner.invoke(app, ["replay", str(trace), "--block-size", "1"])
    assert result.exit_code == 2
    assert "holds a non-integer id ('[bold]x' at position 0)" in result.output.replace("\n", "")


def test_each_result_says_what_the_cache_held_prompt_only_by_default_on_a_trace(
    run: Path, tmp_path: Path
) -> None:
    trace = write_jsonl(mooncake_rows(load_source(PATHOLOGY)), tmp_path / "m.jsonl")
    sweep = ["--policy", "lru", "--capacity-tokens", "2048,3456", "--no-write"]
    docs = {}
    for name, src, extra in (
        ("trace", trace, ["--block-size", "128"]),
        ("trace-outputs", trace, ["--block-size", "128", "--cache-outputs"]),
        ("run", run, []),
        ("run-prompts", run, ["--prompt-only"]),
    ):
        out = tmp_path / f"{name}.json"
        result = runner.invoke(app, ["replay", str(src), *sweep, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        want = "prompt-only" if name in ("trace", "run-prompts") else "cache-outputs"
        assert f"caching: {want}" in result.output.replace("\n", " "), name
        docs[name] = json.loads(out.read_text())
        assert [r["caching"] for r in docs[name]] == [want, want], name
    cached = {name: [r["cached_tokens"] for r in rows] for name, rows in docs.items()}
    assert cached["trace"] == cached["run-prompts"] != cached["run"] == cached["trace-outputs"]
    result = runner.invoke(app, ["replay", str(run), "--live", "--prompt-only"])
    assert result.exit_code == 2 and "not with --live" in result.output


def test_a_prompt_only_replay_of_a_run_keeps_the_engines_fidelity(run: Path) -> None:
    docs = []
    for extra in ([], ["--prompt-only"]):
        assert runner.invoke(app, ["replay", str(run), "--policy", "lru", *extra]).exit_code == 0
        docs.append(json.loads((run / "replay.json").read_text()))
    assert [d["caching"] for d in docs] == ["cache-outputs", "prompt-only"]
    assert docs[0]["fidelity"] == docs[1]["fidelity"] is not None


def test_the_in_request_order_is_an_option_said_in_each_result(tmp_path: Path) -> None:
    trace = write_jsonl(mooncake_rows(load_source(PATHOLOGY)), tmp_path / "m.jsonl")
    args = ["replay", str(trace), "--block-size", "128", "--capacity-tokens", "1024,2048"]
    for order in ("tail-first", "head-first"):
        out = tmp_path / f"{order}.json"
        result = runner.invoke(app, [*args, "--in-request-order", order, "--json", str(out)])
        assert result.exit_code == 0, result.output
        assert f"in-request order: {order}" in result.output.replace("\n", " ")
        assert {r["in_request_order"] for r in json.loads(out.read_text())} == {order}
    result = runner.invoke(app, [*args, "--in-request-order", "middle"])
    assert result.exit_code == 2 and "unknown in-request order 'middle'" in result.output
    sglang = ROOT / "tests" / "fixtures" / "replay" / "pathology-sglang"
    result = runner.invoke(app, ["replay", str(sglang), "--in-request-order", "head-first"])
    assert result.exit_code == 2
    assert "head-first is simulated on vLLM's block pool only" in result.output


@pytest.mark.parametrize("tokens_as", [".jsonl", ".arrow"])
@pytest.mark.parametrize("options", [[], ["--cache-outputs", "--in-request-order", "head-first"]])
def test_a_large_trace_is_replayed_as_it_is_read_to_the_same_numbers(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokens_as: str, options: list[str]
) -> None:
    from kvscope.cli import replay as replay_cli

    moon, toks = tmp_path / "m.jsonl", tmp_path / f"t{tokens_as}"
    args = ["replay", str(run), "--no-write", "--to-mooncake", str(moon), "--to-tokens", str(toks)]
    assert runner.invoke(app, args).exit_code == 0
    for trace in (moon, toks):
        results = []
        for threshold, streamed in ((1 << 60, False), (0, True)):
            monkeypatch.setattr(replay_cli, "STREAM_FROM_BYTES", threshold)
            out = tmp_path / f"{trace.name}.{streamed}.json"
            args = ["replay", str(trace), "--block-size", "128", "--policy", "lru",
                    "--capacity-tokens", "3456", "--json", str(out), *options]  # fmt: skip
            result = runner.invoke(app, args)
            assert result.exit_code == 0, result.output
            assert ("as the trace was read" in result.output) is streamed
            (row,) = json.loads(out.read_text())
            results.append({k: v for k, v in row.items() if k != "seconds"})
        assert results[0] == results[1], trace.name
        assert results[0]["harm"] and results[0]["evictions"]  # not a replay without evictions


def _lru_at(trace: Path, out: Path, *options: str) -> tuple[str, dict]:
    args = ["replay", str(trace), "--block-size", "128", "--policy", "lru",
            "--capacity-tokens", "3456", "--json", str(out), *options]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())
    return result.output, {k: v for k, v in row.items() if k != "seconds"}


def test_a_trace_without_agents_says_its_harm_is_not_attributed_read_whole_or_streamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvscope.cli import replay as replay_cli

    rows = [
        {k: v for k, v in r.items() if k not in ("agent", "workflow", "previous_agent")}
        for r in mooncake_rows(load_source(PATHOLOGY))
    ]
    trace = write_jsonl(rows, tmp_path / "m.jsonl")
    whole_text, whole = _lru_at(trace, tmp_path / "whole.json")
    monkeypatch.setattr(replay_cli, "STREAM_FROM_BYTES", 0)
    text, streamed = _lru_at(trace, tmp_path / "streamed.json")
    assert "harmful evictions not attributed (null)" in text
    assert "harmful evictions not attributed (null)" in whole_text
    assert whole["harm"] is None and streamed["harm"] is None  # no one to attribute: null, not []
    assert whole["evictions"] > 0 and streamed == whole
    assert "harmful evictions: none" not in text and "harmful evictions: none" not in whole_text


def test_a_trace_out_of_start_order_beyond_the_window_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvscope.cli import replay as replay_cli
    from kvscope.sim.inputs import chunks

    rows = list(mooncake_rows(load_source(PATHOLOGY)))
    rows.append({**rows[0], "request_id": "late", "timestamp": rows[0]["timestamp"] - 1.0})
    trace = write_jsonl(rows, tmp_path / "m.jsonl")
    _, whole = _lru_at(trace, tmp_path / "whole.json")
    monkeypatch.setattr(replay_cli, "STREAM_FROM_BYTES", 0)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 64)  # a line or so a chunk: the last one late
    text, again = _lru_at(trace, tmp_path / "again.json")
    assert "as the trace was read" not in text
    assert "replayed from the whole trace" in text and "out of start order" in text  # why
    assert again == whole
    in_order = write_jsonl(rows[:-1], tmp_path / "in_order.jsonl")  # without it: streamed
    assert "as the trace was read" in _lru_at(in_order, tmp_path / "o.json")[0]


def test_a_compressed_trace_is_streamed_whatever_its_size_to_the_plain_ones_numbers(
    run: Path, tmp_path: Path
) -> None:
    """Its text may be many times its size: it is replayed as it is read (bounded memory), and
    gives what the plain file gives read whole."""
    import gzip

    moon = tmp_path / "m.jsonl"
    args = ["replay", str(run), "--no-write", "--to-mooncake", str(moon)]
    assert runner.invoke(app, args).exit_code == 0
    packed = tmp_path / "m.jsonl.gz"
    packed.write_bytes(gzip.compress(moon.read_bytes()))
    plain_out, plain = _lru_at(moon, tmp_path / "plain.json")
    packed_out, unpacked = _lru_at(packed, tmp_path / "packed.json")
    assert "as the trace was read" not in plain_out
    assert "as the trace was read" in packed_out
    assert plain == unpacked
    assert plain["evictions"]  # not a replay without evictions


def test_several_capacities_are_swept_as_the_trace_is_read_to_the_same_numbers(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace naming no agent, requests one after another: LRU at several capacities in one
    streamed pass gives what the whole trace gives; requests that overlap are read whole."""
    from kvscope.cli import replay as replay_cli

    moon = tmp_path / "m.jsonl"
    args = ["replay", str(run), "--no-write", "--to-mooncake", str(moon)]
    assert runner.invoke(app, args).exit_code == 0
    rows = [json.loads(line) for line in moon.read_text().splitlines()]
    for name, life in (("sequential", 500.0), ("overlapping", 5000.0)):
        trace = tmp_path / f"{name}.jsonl"
        unnamed = [
            {"timestamp": i * 1000.0, "end_timestamp": i * 1000.0 + life,
             **{k: r[k] for k in ("input_length", "output_length", "hash_ids")}}
            for i, r in enumerate(rows)
        ]  # fmt: skip
        trace.write_text("".join(json.dumps(r) + "\n" for r in unnamed))
        docs, outputs = [], []
        for threshold in (1 << 60, 0):
            monkeypatch.setattr(replay_cli, "STREAM_FROM_BYTES", threshold)
            out = tmp_path / f"{name}.{threshold}.json"
            args = ["replay", str(trace), "--block-size", "128", "--policy", "lru",
                    "--capacity-tokens", "1024,2048,3456,100000", "--json", str(out)]  # fmt: skip
            result = runner.invoke(app, args)
            assert result.exit_code == 0, result.output
            outputs.append(result.output.replace("\n", " "))
            docs.append([{k: v for k, v in r.items() if k != "seconds"}
                         for r in json.loads(out.read_text())])  # fmt: skip
        assert docs[0] == docs[1] and len(docs[0]) == 4
        hits = [r["cached_tokens"] for r in docs[0]]
        assert hits == sorted(hits) and hits[0] < hits[-1]  # capacities that differ
        streamed = "in one pass over stack distances as the trace was read" in outputs[1]
        assert streamed is (name == "sequential")
        assert "as the trace was read" not in outputs[0]


def test_a_run_that_records_no_capacity_is_refused_before_its_calls_are_read(run: Path) -> None:
    """Without --capacity-tokens, a run whose run.json records no capacity is refused at once
    (its prompts are not read first: here they are unreadable, and that is not what is said)."""
    info = json.loads((run / "run.json").read_text())
    del info["config"]["engine"]["kv_capacity_tokens"]
    del info["environment"]["model"]["capacity_tokens"]
    del info["environment"]["capabilities"]["capacity_tokens"]
    (run / "run.json").write_text(json.dumps(info))
    (run / "prompt_tokens.jsonl").write_text("not the prompts\n" * 3)
    result = runner.invoke(app, ["replay", str(run), "--policy", "lru"])
    assert result.exit_code == 2, result.output
    assert "records no KV capacity: give --capacity-tokens" in result.output
    ok = runner.invoke(app, ["replay", str(run), "--policy", "lru", "--capacity-tokens", "4096"])
    assert "records no KV capacity" not in ok.output


def test_a_large_jsonl_trace_is_read_under_a_bar_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reading bar (cli/replay.reading_bar) follows the bytes read; on a terminal only."""
    import io

    from rich.console import Console

    from kvscope.cli import replay as replay_cli

    rows = [{"timestamp": i, "input_length": 48, "output_length": 2, "hash_ids": [1, 2, i]}
            for i in range(200)]  # fmt: skip
    path = write_jsonl(rows, tmp_path / "m.jsonl")
    out = io.StringIO()
    monkeypatch.setattr(replay_cli, "READ_BAR_FROM_BYTES", 0)
    monkeypatch.setattr(replay_cli, "console", Console(file=out, force_terminal=True, width=100))
    with replay_cli.reading_bar(path):
        load_source(path, block_size=16)
    kb = path.stat().st_size / 1000  # rich's decimal kilobytes: the last frame has all read
    assert "reading m.jsonl" in out.getvalue() and f"{kb:.1f}/{kb:.1f} kB" in out.getvalue()
    monkeypatch.setattr(replay_cli, "console", Console(file=io.StringIO(), force_terminal=False))
    with replay_cli.reading_bar(path):  # not a terminal: no bar, the trace read all the same
        assert len(load_source(path, block_size=16).trace) == 200
