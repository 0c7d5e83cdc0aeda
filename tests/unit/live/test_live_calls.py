"""Building a live replay's calls from each source kind (live/calls.py, live/compare.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

from kvscope.errors import KvscopeError
from kvscope.live.calls import (
    block_tokens,
    cold_prompt,
    limit_workflows,
    live_calls,
    mooncake_prompt,
)
from kvscope.live.compare import original, predicted
from kvscope.live.run import engine_for
from kvscope.live.send import identity_of
from kvscope.probe.identity import CallIdentity, given, identify
from kvscope.records.tokens import load_tokens
from kvscope.sim.inputs.sources import load_source

PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology"
FANOUT = ROOT / "tests" / "fixtures" / "replay" / "fanout"


def test_run_dir_calls_are_the_captured_prompts_and_identities() -> None:
    source = load_source(PATHOLOGY)
    calls = live_calls(source, PATHOLOGY)
    tokens = load_tokens(PATHOLOGY)
    assert len(calls) == 12
    assert [c.agent for c in calls[:4]] == ["planner", "executor", "expresser", "reviewer"]
    assert all(c.prompt_ids == tuple(tokens[c.request_id].tolist()) for c in calls)
    assert all(c.max_tokens == 16 and len(c.prompt_ids) == 937 for c in calls)
    assert [c.turn for c in calls] == [1] * 4 + [2] * 4 + [3] * 4
    assert calls[0].previous_agent is None and calls[1].previous_agent == "planner"
    assert len({c.workflow for c in calls}) == 1


def test_cold_prompts_share_nothing_and_keep_length() -> None:
    source = load_source(PATHOLOGY)
    warm, cold = live_calls(source, PATHOLOGY), live_calls(source, PATHOLOGY, cold=True)
    bs = source.trace.block_size
    heads = {c.prompt_ids[:1] for c in cold}
    assert len(heads) == len(cold)  # the first token already differs: no block is shared
    for w, c in zip(warm, cold, strict=True):
        assert len(c.prompt_ids) == len(w.prompt_ids)
        assert c.prompt_ids[bs:] == w.prompt_ids[bs:]
    assert cold_prompt([5, 6], 3, 16) == cold_prompt([7, 8], 3, 16)  # short prompt: all replaced


def test_mooncake_blocks_expand_deterministically(tmp_path: Path) -> None:
    bs = 4
    assert np.array_equal(block_tokens(7, bs), block_tokens(7, bs))
    assert not np.array_equal(block_tokens(7, bs), block_tokens(8, bs))
    lines = [
        {"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 5, "input_length": 9, "output_length": 2, "hash_ids": [1, 2, 9]},
        {"timestamp": 9, "input_length": 8, "output_length": 1, "hash_ids": [1, 5]},
    ]
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    calls = live_calls(load_source(path, bs), path)
    a, b, c = (list(x.prompt_ids) for x in calls)
    assert [len(a), len(b), len(c)] == [10, 9, 8]
    assert a[:8] == b[:8] and a[8:] != b[8:]  # ids 1, 2 shared; the partial blocks are not
    assert a[:4] == c[:4] and a[4:8] != c[4:8]
    assert [x.max_tokens for x in calls] == [3, 2, 1]
    assert mooncake_prompt([1, 2], 8, bs, 0) == a[:8]


def test_token_trace_calls_and_turns(tmp_path: Path) -> None:
    rows = [
        {"request_id": "r1", "token_ids": [1, 2, 3, 4], "agent": "a", "workflow": "w",
         "output_length": 2},
        {"request_id": "r2", "token_ids": [1, 2, 5], "agent": "b", "workflow": "w"},
        {"request_id": "r3", "token_ids": [1, 2, 3, 4, 6], "agent": "a", "workflow": "w"},
    ]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    calls = live_calls(load_source(path, 2), path)
    assert [c.prompt_ids for c in calls] == [(1, 2, 3, 4), (1, 2, 5), (1, 2, 3, 4, 6)]
    assert [c.turn for c in calls] == [1, 1, 2]
    assert [c.previous_agent for c in calls] == [None, "a", "b"]
    assert [c.max_tokens for c in calls] == [2, 1, 1]  # an unknown output length decodes 1


def test_limit_workflows_keeps_whole_workflows() -> None:
    source = load_source(FANOUT)
    calls = live_calls(source, FANOUT)
    two = limit_workflows(calls, 2)
    assert len({c.workflow for c in two}) == 2
    assert [c.index for c in two] == list(range(len(two)))
    with pytest.raises(KvscopeError):
        limit_workflows(calls, 0)


def test_given_identity_tags_the_call() -> None:
    source = load_source(PATHOLOGY)
    call = live_calls(source, PATHOLOGY)[5]
    with given(identity_of(call)):
        ident = identify()
    assert ident == CallIdentity(agent_id="executor", graph_node="executor",
                                 thread_id=call.workflow, workflow_run_id=call.workflow,
                                 turn_id=2, previous_agent_id="planner")  # fmt: skip
    assert identify().agent_id is None


def test_prediction_and_original_per_agent() -> None:
    source = load_source(PATHOLOGY)
    calls = live_calls(source, PATHOLOGY)
    orig = original(calls)
    assert orig["planner"] == {"prompt_tokens": 3 * 937, "cached_tokens": 1280}
    at_run = predicted(source, calls, source.trace.capacity_tokens)
    assert at_run["per_agent"]["planner"]["cached_tokens"] == 1280  # the engine's own, exactly
    big = predicted(source, calls, 8192)
    assert big["harmful_evictions"] == 0
    assert big["per_agent"]["planner"]["cached_tokens"] > 1280


def test_engine_for_the_source_run_on_free_ports_and_capacity() -> None:
    source = load_source(PATHOLOGY)
    cfg = engine_for(source.run, None, None, 8192)
    assert cfg.kv_capacity_tokens == 8192 and cfg.port != 8000  # type: ignore[union-attr]
    assert engine_for(source.run, None, "http://x:1", None) is None
    with pytest.raises(KvscopeError):
        engine_for(source.run, None, "http://x:1", 8192)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cold-prompts"], "--cold-prompts: only with --live"),
        (["--pacing", "open-loop"], "--pacing: only with --live"),
        (["--live", "--pacing", "closed"], "unknown pacing 'closed'"),
        (["--live", "--capacity-tokens", "1024,2048"], "one --capacity-tokens"),
        (["--live", "--engine", "e.yaml", "--attach", "http://x:1"], "not both"),
    ],
)
def test_live_options_are_checked_before_any_engine(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from kvscope.cli import app

    result = CliRunner().invoke(app, ["replay", str(PATHOLOGY), *args])
    assert result.exit_code != 0
    assert message in " ".join(result.output.split()), result.output


def test_compare_turns_per_agent_turn_and_transition(tmp_path: Path) -> None:
    import shutil

    from kvscope.analysis.run import analyze_run
    from kvscope.report.compare_turns import turns_section

    runs = []
    for name in ("a", "b"):
        shutil.copytree(PATHOLOGY, tmp_path / name)
        runs.append(analyze_run(tmp_path / name))
    assert turns_section(runs[:1]) is None
    section = turns_section(runs)
    assert section is not None
    turns, transitions = section.tables
    assert len(turns.rows) == 12  # 4 agents x 3 turns
    assert turns.rows[4][:3] == ["planner", "2", "640"] and turns.rows[4][-1] == "0.0"
    assert [r[0] for r in transitions.rows][:2] == ["start -> planner", "planner -> executor"]


def _messages_run(tmp_path: Path, store: bool) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(PATHOLOGY, run)
    (run / "prompt_tokens.jsonl").unlink()
    rows = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        msgs = [{"role": "system", "content": "shared"}, {"role": "user", "content": f"q{i}"}]
        r["raw_messages_json"] = json.dumps(msgs) if store else None
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_messages_fallback_without_token_ids(tmp_path: Path) -> None:
    from kvscope.live.messages import message_calls

    calls, skipped = message_calls(_messages_run(tmp_path, True))
    assert skipped == 0 and len(calls) == 12
    assert calls[0].prompt_ids == () and calls[0].messages[1] == {"role": "user", "content": "q0"}
    assert [c.agent for c in calls[:2]] == ["planner", "executor"] and calls[5].turn == 2
    assert calls[4].recorded_cached == 640 and calls[0].max_tokens == 16
    cold, _ = message_calls(_messages_run(tmp_path / "c", True), cold=True)
    assert len({c.messages[0]["content"] for c in cold}) == 12  # a unique first message each
    assert original(calls)["planner"] == {"prompt_tokens": 3 * 937, "cached_tokens": 1280}


def test_no_token_ids_and_no_messages_is_a_clear_error(tmp_path: Path) -> None:
    from kvscope.live.messages import message_calls

    with pytest.raises(KvscopeError, match="store_prompts"):
        message_calls(_messages_run(tmp_path, False))
