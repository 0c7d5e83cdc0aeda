"""Loading a replay's trace: a recorded vLLM run directory, and the same requests as a Mooncake
trace and as a token-id trace (identical replays); clear errors for bad input."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

from kvscope.errors import KvscopeError
from kvscope.sim.inputs import chunks
from kvscope.sim.inputs.convert import mooncake_rows, token_rows, write_jsonl, write_trace
from kvscope.sim.inputs.rows import KeyChunks
from kvscope.sim.inputs.schedule import scheduled_start
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.results.summary import summarize
from kvscope.sim.simulate import simulate

PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology"


def test_a_run_directory_loads_its_calls_capacity_and_measurements() -> None:
    source = load_source(PATHOLOGY)
    trace = source.trace
    assert source.kind == "run" and source.policy == "lru" and trace.engine == "vllm"
    assert len(trace) == 12 and trace.block_size == 128 and trace.capacity_tokens == 3456
    assert source.excluded == {} and not source.id_mismatch.any()
    assert list(trace.measured_cached_tokens) == [0.0] * 4 + [640.0] * 8
    assert trace.agents[:4] == ("planner", "executor", "expresser", "reviewer")
    assert trace.transition(4) == "reviewer -> planner"
    rows = [json.loads(line) for line in (PATHOLOGY / "requests.jsonl").open()]
    first = min(rows, key=lambda r: r["start_ns"])
    assert trace.start_s[0] == pytest.approx(scheduled_start(first))  # engine-scheduled
    assert trace.end_s[0] == pytest.approx(first["end_ns"] / 1e9)
    assert np.all(np.diff(trace.start_s) >= 0)


def test_failed_calls_and_calls_without_token_ids_are_left_out_and_counted(
    tmp_path: Path,
) -> None:
    run = shutil.copytree(PATHOLOGY, tmp_path / "run")
    rows = [json.loads(line) for line in (run / "requests.jsonl").open()]
    rows[0]["status"] = "error"
    write_jsonl(rows, run / "requests.jsonl")
    tokens = [json.loads(line) for line in (run / "prompt_tokens.jsonl").open()]
    gone = tokens.pop(5)["request_uuid"]
    write_jsonl(tokens, run / "prompt_tokens.jsonl")
    source = load_source(run)
    assert len(source.trace) == 10
    assert source.excluded == {"status error": 1, "no prompt token ids": 1}
    assert gone not in source.trace.request_ids


def _numbers(summary: dict) -> dict:
    """A summary without its wall time (and TTFT, which needs a run's measurements)."""
    return {k: v for k, v in summary.items() if k not in ("seconds", "ttft_saved_ms")}


def test_the_same_requests_as_mooncake_and_token_id_traces_replay_identically(
    tmp_path: Path,
) -> None:
    run = load_source(PATHOLOGY)
    moon = load_source(write_jsonl(mooncake_rows(run), tmp_path / "m.jsonl"), block_size=128)
    toks = load_source(write_jsonl(token_rows(run), tmp_path / "t.jsonl"), block_size=128)
    arrow = load_source(write_trace(token_rows(run), tmp_path / "t.arrow"), block_size=128)
    assert (moon.kind, toks.kind, arrow.kind) == ("mooncake", "tokens", "tokens")
    assert arrow.trace.previous_agents == toks.trace.previous_agents == run.trace.previous_agents
    for blocks in (16, 27, 29, 40):
        want = _numbers(summarize(run.trace, simulate(run.trace, "lru", blocks)).to_dict())
        for other in (moon, toks, arrow):
            got = summarize(other.trace, simulate(other.trace, "lru", blocks)).to_dict()
            assert _numbers(got) == want, (other.kind, blocks)


def test_mooncake_rows_are_not_written_as_arrow(tmp_path: Path) -> None:
    rows = mooncake_rows(load_source(PATHOLOGY))
    with pytest.raises(KvscopeError, match="only a token-id trace is written as Arrow"):
        write_trace(rows, tmp_path / "m.arrow")


def test_a_previous_agent_not_given_is_the_workflows_previous_agent(tmp_path: Path) -> None:
    lines = [
        {
            "request_id": "a",
            "token_ids": [1, 2, 3, 4],
            "timestamp": 0,
            "agent": "x",
            "workflow": "w",
        },
        {
            "request_id": "b",
            "token_ids": [1, 2, 3, 5],
            "timestamp": 2,
            "agent": "y",
            "workflow": "w",
        },
        {"request_id": "c", "token_ids": [9, 9], "timestamp": 1, "agent": "z", "workflow": "v"},
    ]
    source = load_source(write_jsonl(lines, tmp_path / "t.jsonl"), block_size=2)
    trace = source.trace
    assert trace.request_ids == ("a", "c", "b")  # in time order
    assert trace.previous_agents == (None, None, "x")
    assert trace.transition(2) == "x -> y"
    assert list(trace.output_tokens) == [0, 0, 0] and "without output_length" in source.notes[0]
    assert trace.blocks_of(0)[0] == trace.blocks_of(2)[0] != trace.blocks_of(0)[1]


def test_a_mooncake_trace_keeps_the_ids_of_full_blocks_only(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [7, 8, 9]},
        {"timestamp": 1000, "input_length": 4, "output_length": 1, "hash_ids": [7, 8]},
    ]
    trace = load_source(write_jsonl(lines, tmp_path / "m.jsonl"), block_size=2).trace
    assert [list(trace.blocks_of(i)) for i in range(2)] == [[7, 8], [7, 8]]
    assert list(trace.start_s) == [0.0, 1.0] and list(trace.end_s) == [0.0, 1.0]


@pytest.mark.parametrize(("chunk", "chunk_bytes"), [(1, 1), (2, 100), (4096, 1 << 20)])
def test_lines_out_of_time_order_keep_their_keys(
    tmp_path: Path, chunk: int, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines are read and keys gathered a chunk at a time; sorting by time keeps each line's
    own."""
    monkeypatch.setattr(KeyChunks, "CHUNK", chunk)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk_bytes)
    times = [5, 1, 3, 0, 4]
    ids = [[1, 2, 3], [4], [], [5, 6], [1 << 63, 8, 9, 10]]
    lines = [
        {"timestamp": t, "input_length": 2 * len(h), "output_length": 1, "hash_ids": h}
        for t, h in zip(times, ids, strict=True)
    ]
    trace = load_source(write_jsonl(lines, tmp_path / "m.jsonl"), block_size=2).trace
    by_time = [ids[i] for i in np.argsort(times, kind="stable")]
    assert [trace.blocks_of(i).tolist() for i in range(5)] == by_time
    assert trace.keys.dtype == np.uint64 and trace.offsets.tolist() == [0, 2, 3, 3, 7, 10]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"timestamp": 0, "input_length": 4, "output_length": 1}, "m.jsonl:2: neither"),
        (
            {"timestamp": 0, "input_length": 4, "hash_ids": [1, 2]},
            "m.jsonl:2: missing field 'output_length'",
        ),
        (
            {"timestamp": "x", "input_length": 4, "output_length": 1, "hash_ids": [1]},
            "m.jsonl:2: field 'timestamp'",
        ),
        (
            {"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1]},
            "m.jsonl:2: field 'hash_ids' has 1 ids, but input_length 8 is 4 blocks of 2 tokens",
        ),
    ],
)
def test_a_bad_mooncake_line_names_its_line_and_field(
    tmp_path: Path, line: dict, message: str
) -> None:
    path = tmp_path / "m.jsonl"
    good = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1, 2]}
    if "hash_ids" not in line and "output_length" in line:
        write_jsonl([line, good], path)  # first line decides the format
        message = message.replace(":2:", ":1:")
    else:
        write_jsonl([good, line], path)
    with pytest.raises(KvscopeError, match=message):
        load_source(path, block_size=2)


def test_clear_errors_for_missing_inputs(tmp_path: Path) -> None:
    with pytest.raises(KvscopeError, match="does not exist"):
        load_source(tmp_path / "nope.jsonl")
    run = shutil.copytree(PATHOLOGY, tmp_path / "run")
    (run / "prompt_tokens.jsonl").unlink()
    with pytest.raises(KvscopeError, match="Level 3 prompt token ids were not captured"):
        load_source(run)
    trace = write_jsonl([{"request_id": "a", "token_ids": [1]}], tmp_path / "t.jsonl")
    with pytest.raises(KvscopeError, match="--block-size"):
        load_source(trace)
    (tmp_path / "bad.jsonl").write_text('{"request_id": "a", "token_ids": [1]}\n{oops\n')
    with pytest.raises(KvscopeError, match=r"bad\.jsonl:2: not JSON"):
        load_source(tmp_path / "bad.jsonl", block_size=1)


def test_a_trace_without_durations_releases_each_request_before_the_next(tmp_path: Path) -> None:
    run = load_source(PATHOLOGY)
    rows = mooncake_rows(run)
    for row in rows:
        del row["end_timestamp"]
    trace = load_source(write_jsonl(rows, tmp_path / "m.jsonl"), block_size=128).trace
    assert not simulate(trace, "lru", 27).preempted.any()


def test_an_attached_engine_is_replayed_with_its_detected_family(tmp_path: Path) -> None:
    run = shutil.copytree(PATHOLOGY, tmp_path / "run")
    info = json.loads((run / "run.json").read_text())
    info["config"]["engine"]["kind"] = "attach"
    (run / "run.json").write_text(json.dumps(info))
    assert load_source(run).trace.engine == "vllm"  # environment.capabilities.family
    info["environment"]["capabilities"]["family"] = None
    (run / "run.json").write_text(json.dumps(info))
    source = load_source(run)
    assert source.trace.engine is None and "'attach'" in source.notes[0]


@pytest.mark.parametrize(
    ("text", "lifted"),
    [
        (b'{"request_id":"a","token_ids":[5,0,17],"x":1}', [5, 0, 17]),
        (b'{"token_ids":[],"request_id":"a"}', []),
        (b'{"token_ids":[ 3 , 4 ],"request_id":"a"}', None),  # not compact: parsed whole
        (b'{"token_ids":[1,2.5],"request_id":"a"}', None),  # a fraction: parsed whole, refused
        (b'{"token_ids":[1,-2],"request_id":"a"}', None),
        (b'{"token_ids":[1,true],"request_id":"a"}', None),
        (b'{"token_ids":[1,[2]],"request_id":"a"}', None),
        (b'{"token_ids":[9223372036854775808],"request_id":"a"}', None),  # 2**63: uint64 path
        (b'{"token_ids":[1,,2],"request_id":"a"}', None),
        (b'{"token_ids":[1,2,],"request_id":"a"}', None),
        (b'{"request_id":"\\"token_ids\\":[1]","token_ids":[7]}', [7]),
    ],
)
def test_token_ids_are_lifted_into_an_array_only_when_plain(
    text: bytes, lifted: list | None
) -> None:
    ids, rest = chunks.lifted_ids(text, b'"token_ids":[')
    if lifted is None:
        assert ids is None and rest == text
    else:
        assert ids is not None and ids.dtype == np.int64 and ids.tolist() == lifted
        row = json.loads(rest)
        assert row["token_ids"] == [] and row["request_id"] == json.loads(text)["request_id"]


def test_lifted_and_parsed_lines_load_the_same(tmp_path: Path) -> None:
    compact = tmp_path / "c.jsonl"
    spaced = tmp_path / "s.jsonl"
    rows = [{"request_id": f"r{i}", "token_ids": list(range(i, i + 9))} for i in range(5)]
    compact.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    spaced.write_text("".join(json.dumps(r) + "\n" for r in rows))  # "token_ids": [ (not lifted)
    a, b = (load_source(p, block_size=4).trace for p in (compact, spaced))
    assert a.keys.tolist() == b.keys.tolist() and len(a.keys) == 10
    assert a.prompt_tokens.tolist() == b.prompt_tokens.tolist() == [9] * 5


def test_hash_ids_lifted_or_parsed_load_the_same(tmp_path: Path) -> None:
    ids = [[1, 2, 3], [(1 << 64) - 1, 1 << 63], [7, 0]]  # the second: beyond int64, parsed whole
    rows = [
        {"timestamp": i, "input_length": 2 * len(h), "output_length": 1, "hash_ids": h}
        for i, h in enumerate(ids)
    ]
    compact, spaced = tmp_path / "c.jsonl", tmp_path / "s.jsonl"
    compact.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    spaced.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = (load_source(p, block_size=2).trace for p in (compact, spaced))
    assert a.keys.dtype == b.keys.dtype == np.uint64
    assert a.keys.tolist() == b.keys.tolist() == [k for h in ids for k in h]
