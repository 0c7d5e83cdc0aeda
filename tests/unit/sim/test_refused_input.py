"""What a replay refuses rather than answer wrong (issue 31, item 3): a block size the trace's
ids contradict, ids that are not integers from 0, negative lengths, a policy that needs agents
on a trace without them; and the capacity rounding it says."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ROOT

from kvscope.errors import KvscopeError
from kvscope.sim import plan
from kvscope.sim.inputs.sources import load_source

PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology"


SEPARATORS: dict[str, tuple[str, str]] = {"now": (", ", ": ")}


@pytest.fixture(autouse=True, params=["spaced", "compact"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test on lines as json.dumps writes them by default and compact, as orjson does:
    both are read a chunk at a time (sim/inputs/chunks.py), refused line by line."""
    seps = (", ", ": ") if request.param == "spaced" else (",", ":")
    monkeypatch.setitem(SEPARATORS, "now", seps)


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, separators=SEPARATORS["now"]) + "\n" for r in rows))
    return path


def _moon(length: int, ids: list[Any], **extra: Any) -> dict[str, Any]:
    return {"timestamp": 0, "input_length": length, "output_length": 4, "hash_ids": ids, **extra}


def _tokens(ids: list[Any], **extra: Any) -> dict[str, Any]:
    return {"request_id": "r", "token_ids": ids, **extra}


def test_a_mooncake_trace_read_with_the_wrong_block_size_is_refused(tmp_path: Path) -> None:
    # written with 512-token blocks: 1,300 tokens are 3 blocks, the last partial
    rows = [_moon(1300, [0, 1, 2]), _moon(1300, [0, 1, 3]), _moon(2000, [0, 1, 4, 5])]
    path = _write(tmp_path / "m.jsonl", rows)
    assert len(load_source(path, block_size=512).trace) == 3
    with pytest.raises(KvscopeError) as err:
        load_source(path, block_size=1024)
    assert str(err.value) == (
        f"{path}:1: field 'hash_ids' has 3 ids, but input_length 1300 is 2 blocks of 1024 "
        "tokens (1 full); 3 ids fit a block size of 434 to 649: is --block-size right?"
    )
    with pytest.raises(KvscopeError, match=r"m\.jsonl:1: .* has 3 ids, .* 6 blocks of 256"):
        load_source(path, block_size=256)


def test_a_trace_that_leaves_out_the_partial_blocks_id_is_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", [_moon(1300, [0, 1]), _moon(1024, [0, 1])])
    trace = load_source(path, block_size=512).trace
    assert [list(trace.blocks_of(i)) for i in range(2)] == [[0, 1], [0, 1]]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1, 1.5], "holds a fractional id (1.5 at position 1)"),
        ([-1, 2], "holds a negative id (-1 at position 0)"),
        ([1, "2"], "holds a non-integer id ('2' at position 1)"),
        ([1, True], "holds a non-integer id (True at position 1)"),
        ([1, None], "holds a non-integer id (None at position 1)"),
        ([1, [2]], "holds a non-integer id ([2] at position 1)"),
        ([1, 2.0], "holds a non-integer id (2.0 at position 1)"),
        ([1, 1 << 64], "holds an id beyond 64 bits (1.8446744073709552e+19 at position 1)"),
        ([1, -(1 << 64)], "holds an id beyond 64 bits (-1.8446744073709552e+19 at position 1)"),
    ],
)
def test_ids_that_are_not_integers_from_0_are_refused_naming_the_line(
    tmp_path: Path, ids: list[Any], message: str
) -> None:
    moon = _write(tmp_path / "m.jsonl", [_moon(4, [7, 8]), _moon(4, ids)])
    with pytest.raises(KvscopeError) as err:
        load_source(moon, block_size=2)
    assert str(err.value).startswith(f"{moon}:2: field 'hash_ids' {message}")
    toks = _write(tmp_path / "t.jsonl", [_tokens([7, 8, 9]), _tokens([3, 4, *ids])])
    message = message.replace("position 1", "position 3").replace("position 0", "position 2")
    with pytest.raises(KvscopeError) as err:
        load_source(toks, block_size=2)
    assert str(err.value).startswith(f"{toks}:2: field 'token_ids' {message}")


def test_64_bit_ids_are_kept_exactly(tmp_path: Path) -> None:
    big = [(1 << 64) - 1, 1 << 63, 5]
    moon = _write(tmp_path / "m.jsonl", [_moon(6, big), _moon(6, [5, 1 << 63, 6])])
    trace = load_source(moon, block_size=2).trace
    assert trace.keys.dtype == np.uint64 and trace.keys.tolist() == [*big, 5, 1 << 63, 6]
    # token ids are taken modulo 2**64 (records.blockkey): 2**64 - 1 is -1's key
    toks = _write(tmp_path / "t.jsonl", [_tokens([(1 << 64) - 1, 1 << 63, 5, 6])])
    same = _write(tmp_path / "s.jsonl", [_tokens([-1 & ((1 << 64) - 1), 1 << 63, 5, 6])])
    one, two = (load_source(p, block_size=2).trace for p in (toks, same))
    assert one.keys.tolist() == two.keys.tolist() and len(one.keys) == 2


@pytest.mark.parametrize("name", ["input_length", "output_length"])
def test_a_negative_length_is_refused(tmp_path: Path, name: str) -> None:
    row = _moon(4, [1, 2])
    row[name] = -5
    path = _write(tmp_path / "m.jsonl", [_moon(4, [1, 2]), row])
    with pytest.raises(KvscopeError) as err:
        load_source(path, block_size=2)
    assert str(err.value) == f"{path}:2: field {name!r} is negative (-5)"


def test_a_token_traces_negative_output_length_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_tokens([1, 2], output_length=-1)])
    with pytest.raises(KvscopeError, match=r"t\.jsonl:1: field 'output_length' is negative"):
        load_source(path, block_size=2)


@pytest.mark.parametrize(
    "policy",
    ["steps-to-execution", "predicted-next-agent", "steps-to-execution-hints",
     "predicted-next-hints"],
)  # fmt: skip
def test_a_policy_that_ranks_by_agent_is_refused_on_a_trace_without_agents(
    tmp_path: Path, policy: str
) -> None:
    path = _write(tmp_path / "m.jsonl", [_moon(4, [1, 2]), _moon(4, [1, 3])])
    source = load_source(path, block_size=2)
    with pytest.raises(KvscopeError) as err:
        plan.make_plan(source, ["lru", policy], ["8"])
    assert str(err.value).startswith(
        f"policy {policy!r} ranks blocks by agent, and no request of {path} names one "
        "(it would replay as LRU)"
    )
    tagged = _write(tmp_path / "a.jsonl", [_moon(4, [1, 2], agent="x"), _moon(4, [1, 3])])
    assert policy in plan.make_plan(load_source(tagged, block_size=2), [policy], ["8"]).policies


def test_agent_policies_among_the_defaults_are_skipped_on_a_run_without_agents() -> None:
    source = load_source(PATHOLOGY)
    assert plan.choose_policies([], source) == (
        ["lru", "steps-to-execution", "predicted-next-agent", "belady"],
        [],
    )
    none = (None,) * len(source.trace)
    agentless = replace(source, trace=replace(source.trace, agents=none, previous_agents=none))
    chosen, notes = plan.choose_policies([], agentless)
    assert chosen == ["lru", "belady"]
    assert notes == [
        f"policy {p!r} skipped: no request names an agent (it equals LRU)"
        for p in ("steps-to-execution", "predicted-next-agent")
    ]


def test_a_capacity_of_part_blocks_is_said_and_kept_as_asked(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", [_moon(1300, [0, 1, 2]), _moon(1300, [0, 1, 3])])
    source = load_source(path, block_size=512)
    made = plan.make_plan(source, ["lru"], ["1_000_000", "1024"])
    assert made.notes[0] == (
        "capacity 1,000,000 tokens replayed as 1,953 whole blocks of 512 = 999,936 tokens "
        "(a cache holds whole blocks)"
    )
    big, small = plan.run_plan(source, made).summaries
    assert (big.capacity_tokens, big.requested_capacity_tokens) == (999_936, 1_000_000)
    assert (small.capacity_tokens, small.requested_capacity_tokens) == (1024, 1024)
