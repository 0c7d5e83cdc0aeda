"""finalize.prompts: prompts held as distinct pieces give back exactly their tokens, share the
pieces of a common prefix, and load from a run's stream as records.tokens.load_tokens reads it."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from kvscope.finalize import piecehash
from kvscope.finalize.prompts import Prompts, load_prompts
from kvscope.records import blockkey
from kvscope.records.tokens import TOKENS_JSONL, load_tokens


def shared(seed: int, n: int = 12) -> list[list[int]]:
    """Prompts cutting one head at random places, each with a tail of its own."""
    r = random.Random(seed)
    head = [r.randrange(6) for _ in range(r.randrange(50))]
    return [
        head[: r.randrange(len(head) + 1)] + [r.randrange(6) for _ in range(r.randrange(20))]
        for _ in range(r.randrange(1, n))
    ]


@pytest.mark.parametrize("seed", range(40))
def test_prompts_give_back_their_tokens_in_any_selection_and_batch(seed: int) -> None:
    r = random.Random(seed)
    ps = shared(seed)
    dtype = r.choice([np.uint16, np.int32, np.int64])
    prompts = Prompts.of([np.array(p, dtype=dtype) for p in ps], r.choice([1, 3, 4, 16, 64]))
    assert prompts.dtype == dtype and prompts.lengths.tolist() == list(map(len, ps))
    assert [prompts.tokens(i).tolist() for i in range(len(ps))] == ps
    lo = r.randrange(len(ps))
    hi = r.randrange(lo, len(ps) + 1)
    assert prompts.concat(lo, hi).tolist() == [t for p in ps[lo:hi] for t in p]
    which = [r.randrange(len(ps)) for _ in range(6)]
    chosen = prompts.select(which)
    assert [chosen.tokens(j).tolist() for j in range(len(which))] == [ps[i] for i in which]
    # blockkey reads Prompts as it reads the lists
    for got, want in zip(
        blockkey.prompt_blocks(chosen, 4), blockkey.prompt_blocks([ps[i] for i in which], 4),
        strict=True,
    ):  # fmt: skip
        assert np.array_equal(got, want)


def test_a_shared_prefix_is_held_once() -> None:
    head = list(range(100, 100 + 4 * 16))
    ps = [[*head, 1, 2], [*head, 3], head[:40] + [7] * 30, head]
    prompts = Prompts.of(ps, 16)
    # each distinct 16-token piece once (the head's first pieces are shared by three prompts)
    distinct = {tuple(prompts.tokens(i)[k * 16 : k * 16 + 16]) for i in range(4) for k in range(5)}
    assert len(prompts.rows) == len(distinct - {()})
    assert len(prompts.rows) < sum(-(-len(p) // 16) for p in ps)
    assert prompts.seq[prompts.offsets[0] : prompts.offsets[0] + 4].tolist() == list(
        prompts.seq[prompts.offsets[3] : prompts.offsets[4]]
    )


def _lines(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / TOKENS_JSONL).write_text("".join(f"{x}\n" for x in lines))
    return tmp_path


def test_load_prompts_reads_the_stream_as_load_tokens_does(tmp_path: Path) -> None:
    ps = shared(3, 40)
    lines = [json.dumps({"request_uuid": f"u{i}", "token_ids": p}) for i, p in enumerate(ps)]
    lines[2] = '{"request_uuid": "u2", "token_ids": [1, 2'  # torn: skipped
    lines.insert(5, json.dumps({"token_ids": [1, 2], "request_uuid": "u1"}))  # u1 again: last wins
    lines.append(json.dumps({"request_uuid": "big", "token_ids": [70000, 3]}))  # widens
    lines.append(json.dumps({"request_uuid": "none", "token_ids": None}))
    run = _lines(tmp_path, lines)
    want = load_tokens(run)
    got = load_prompts(run)
    assert set(got.index) == set(want)
    for u, ids in want.items():
        assert got.tokens(got.index[u]).tolist() == ids.tolist()
    assert got.dtype == np.int32 and got.tokens(got.index["u1"]).tolist() == [1, 2]


def test_load_prompts_numbers_lines_whose_lists_are_all_empty(tmp_path: Path) -> None:
    ids = [[], [], [5, 6], []]
    lines = [json.dumps({"request_uuid": f"u{i}", "token_ids": p}) for i, p in enumerate(ids)]
    for part in (lines[:2], lines):  # a stream of empty lists only; then with ids after them
        got = load_prompts(_lines(tmp_path, part))
        assert {u: got.tokens(i).tolist() for u, i in got.index.items()} == {
            f"u{i}": ids[i] for i in range(len(part))
        }


def test_load_prompts_of_a_run_without_a_stream_is_empty(tmp_path: Path) -> None:
    got = load_prompts(tmp_path)
    assert len(got) == 0 and not got and got.get("x") is None


@pytest.mark.parametrize("seed", range(30))
def test_first_windows_found_on_distinct_pieces_are_those_of_every_window(seed: int) -> None:
    r = random.Random(seed)
    ps = shared(seed, 16)
    prompts = Prompts.of(ps, r.choice([2, 3, 4, 8]))
    for size in (1, 2, 3, 4, 5):
        # queries: every window of the prompts, some blocks of them, and hashes held by none
        every = [p[i : i + size] for p in ps for i in range(len(p) - size + 1)]
        held = blockkey.prompt_blocks(every, size)[1] if every else np.zeros(0, np.uint64)
        queries = np.unique(np.concatenate([held, np.array([1, 2, 3], dtype=np.uint64)]))
        want = blockkey.first_windows_of_sorted(ps, size, queries)
        for worth in (np.inf, 0.0):  # found on the pieces and pairs; on every window
            got = piecehash.first_windows_of_sorted(prompts, size, queries, worth)
            assert got.tolist() == want.tolist()
        assert (want < len(ps)).sum() == len(np.unique(held))


@pytest.mark.parametrize("seed", range(30))
def test_block_keys_from_distinct_pieces_are_those_of_the_tokens(seed: int) -> None:
    r = random.Random(seed)
    ps = shared(seed, 16)
    dtype = r.choice([np.uint16, np.int32, np.int64])
    prompts = Prompts.of([np.array(p, dtype=dtype) for p in ps], r.choice([4, 8, 16]))
    for size in (1, 2, 3, 4, 8):  # 3 divides no piece: every token hashed
        want = blockkey.prompt_blocks(ps, size)
        got = piecehash.prompt_blocks(prompts, size)
        assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
        keys, hashes, _ = piecehash.prompt_blocks(prompts, size, hashes=False)
        assert np.array_equal(keys, want[0]) and not len(hashes)
