"""load_tokens gives uint16 ids when a run's ids fit (records.tokens): every consumer of
them must give what it gives on the same ids as int32 (KV events' ids) or int64, and no uint16
arithmetic may wrap (a -1 padding, a difference)."""

import json
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import ROOT
from oracles import PrefixIndex, first_windows

from kvscope.finalize import finalize, lcp
from kvscope.finalize.divergence import with_divergence
from kvscope.finalize.prompts import Prompts, load_prompts
from kvscope.live import calls as live
from kvscope.records import blockkey, requests
from kvscope.records.blocks import BLOCKS_PARQUET
from kvscope.records.kv_events import KV_EVENTS_PARQUET
from kvscope.records.tokens import common_prefix, load_tokens
from kvscope.sim.inputs import convert
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.results.summary import summarize
from kvscope.sim.simulate import simulate

RECORDED = ROOT / "tests" / "fixtures" / "recorded-runs"
RUNS = sorted(p for p in RECORDED.iterdir() if p.is_dir() and p.name != "expected")
PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology"
DTYPES = (np.uint16, np.int32, np.int64)


def prompts(seed: int, top: int = 1 << 16) -> list[list[int]]:
    """Prompts sharing prefixes, with ids at both ends of uint16's range."""
    r = random.Random(seed)
    pool = [0, 1, top - 2, top - 1]
    base = [r.choice(pool) if r.random() < 0.5 else r.randrange(top) for _ in range(64)]
    out = []
    for _ in range(30):
        cut = r.randrange(len(base) + 1)
        tail = [r.choice(pool) for _ in range(r.randrange(20))]
        out.append(base[:cut] + tail)
    return out


def as_dtype(ps: list[list[int]], dtype: Any) -> list[np.ndarray]:
    return [np.array(p, dtype=dtype) for p in ps]


@pytest.mark.parametrize("seed", range(5))
def test_block_keys_hashes_and_windows_do_not_depend_on_the_dtype(seed: int) -> None:
    ps = prompts(seed)
    for size in (1, 4, 16):
        want_blocks = blockkey.prompt_blocks(ps, size)  # Python ints
        flat, ends = (
            np.concatenate([np.array(p, np.int64) for p in ps]),
            np.cumsum(list(map(len, ps))),
        )
        spans = (ends - np.array(list(map(len, ps))), ends)
        want_pieces = blockkey.span_hashes(flat, *spans)
        queries = want_blocks[1][::3]
        want_first = first_windows(ps, size, queries)
        for dtype in DTYPES:
            arrays = as_dtype(ps, dtype)
            got = blockkey.prompt_blocks(arrays, size)
            assert all(np.array_equal(x, y) for x, y in zip(got, want_blocks, strict=True))
            assert np.array_equal(blockkey.span_hashes(flat.astype(dtype), *spans), want_pieces)
            assert np.array_equal(first_windows(arrays, size, queries), want_first)
        # a prompt's ids as uint16 against the KV events' ids as int32: the same block keys
        mixed = as_dtype(ps[:15], np.uint16) + as_dtype(ps[15:], np.int32)
        got = blockkey.prompt_blocks(mixed, size)
        assert all(np.array_equal(x, y) for x, y in zip(got, want_blocks, strict=True))


@pytest.mark.parametrize("seed", range(5))
def test_prefixes_do_not_depend_on_the_dtype(seed: int) -> None:
    ps = prompts(seed)
    index, want = PrefixIndex(), []
    for p in ps:  # the reference: Python ints
        want.append(index.longest(p))
        index.add(p)
    for dtype in DTYPES:
        arrays = as_dtype(ps, dtype)
        for chunk in (1, 3, 16, 256):
            assert lcp.longest_with_earlier(arrays, chunk=chunk) == want, (dtype, chunk)
        index, got = PrefixIndex(), []
        for a in arrays:
            got.append(index.longest(a))
            index.add(a)
        assert got == want
        pairs = [(common_prefix(a, b), common_prefix(b, a)) for a, b in pairwise(arrays)]
        assert pairs == [(common_prefix(a, b),) * 2 for a, b in pairwise(ps)]


def test_a_prompt_ending_where_another_has_the_greatest_id() -> None:
    """A shorter prompt is padded below every id when pieces are sorted: not with 65535."""
    ps = [[7, 65535], [7], [7, 65535, 3], [7, 0], [7], [7, 65535]]
    want = [0, 1, 2, 1, 1, 2]
    for dtype in DTYPES:
        for chunk in (1, 2, 256):
            assert lcp.longest_with_earlier(as_dtype(ps, dtype), chunk=chunk) == want


def test_replay_keys_do_not_depend_on_the_dtype() -> None:
    from kvscope.sim.trace import chain_keys

    ps = prompts(3)
    want = chain_keys(ps, 4)
    for dtype in DTYPES:
        got = chain_keys(as_dtype(ps, dtype), 4)
        assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))


@pytest.fixture
def as_int32(monkeypatch: pytest.MonkeyPatch) -> Callable[[], AbstractContextManager[None]]:
    """A context in which every reader of load_tokens gets the ids as int32 (as before)."""

    def widened(run_dir: Path) -> dict[str, np.ndarray]:
        return {u: a.astype(np.int32) for u, a in load_tokens(run_dir).items()}

    def widened_prompts(run_dir: Path) -> Prompts:
        prompts = load_prompts(run_dir)
        return replace(prompts, rows=prompts.rows.astype(np.int32))

    @contextmanager
    def use() -> Iterator[None]:
        with monkeypatch.context() as m:
            m.setattr("kvscope.records.tokens.load_tokens", widened)  # RunDir.tokens reads it
            m.setattr("kvscope.finalize.tables.load_prompts", widened_prompts)
            yield

    return use


def tables(run: Path) -> dict[str, Any]:
    out: dict[str, Any] = {n: pq.read_table(run / n) for n in (KV_EVENTS_PARQUET, BLOCKS_PARQUET)}
    out["requests"] = requests.load_table(run)
    out["finalize.json"] = json.loads((run / "finalize.json").read_text())
    return out


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_finalize_gives_the_same_tables_with_uint16_ids(
    tmp_path: Path, run: Path, as_int32: Callable[[], AbstractContextManager[None]]
) -> None:
    assert load_tokens(run) and all(a.dtype == np.uint16 for a in load_tokens(run).values())
    assert load_prompts(run).dtype == np.uint16
    narrow, wide = shutil.copytree(run, tmp_path / "u16"), shutil.copytree(run, tmp_path / "i32")
    finalize(narrow)
    with as_int32():
        finalize(wide)
    got, want = tables(narrow), tables(wide)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == want[name], name
    measured = [r for r in got["requests"].to_pylist() if r["max_reusable_tokens"] is not None]
    assert measured  # the prompt ids were used


def test_finalize_of_a_deployment_with_uint16_ids(
    tmp_path: Path, as_int32: Callable[[], AbstractContextManager[None]]
) -> None:
    from test_deployment_tables import write_run

    (tmp_path / "u16").mkdir()
    narrow = write_run(tmp_path / "u16")
    wide = shutil.copytree(narrow, tmp_path / "i32")
    assert next(iter(load_tokens(narrow).values())).dtype == np.uint16
    finalize(narrow)
    with as_int32():
        finalize(wide)
    got, want = tables(narrow), tables(wide)
    assert got == want
    assert any(r["routing_miss_tokens"] for r in got["requests"].to_pylist())


def test_replay_gives_the_same_results_with_uint16_ids(
    tmp_path: Path, as_int32: Callable[[], AbstractContextManager[None]]
) -> None:
    narrow = load_source(PATHOLOGY)
    with as_int32():
        wide = load_source(PATHOLOGY)
        wide_rows = convert.token_rows(wide)
        wide_calls = live.live_calls(wide, PATHOLOGY)
    assert np.array_equal(narrow.trace.keys, wide.trace.keys)
    assert np.array_equal(narrow.trace.offsets, wide.trace.offsets)
    assert np.array_equal(narrow.id_mismatch, wide.id_mismatch)
    assert np.array_equal(narrow.trace.start_s, wide.trace.start_s)  # scheduling compares ids
    for blocks in (16, 27, 40):
        for policy in ("lru", "none"):
            a = summarize(narrow.trace, simulate(narrow.trace, policy, blocks)).to_dict()
            b = summarize(wide.trace, simulate(wide.trace, policy, blocks)).to_dict()
            assert {k: v for k, v in a.items() if k != "seconds"} == {
                k: v for k, v in b.items() if k != "seconds"
            }
    rows = convert.token_rows(narrow)
    assert json.dumps(rows) == json.dumps(wide_rows)  # plain ints, JSON-ready
    assert live.live_calls(narrow, PATHOLOGY) == wide_calls


def test_divergence_does_not_depend_on_the_dtype() -> None:
    ps = [[7], [7, 65535], [7, 65535, 3], [7, 0, 1], [7, 65535, 3, 65535], [], [65535]]
    agents = ["a", "a", "b", "a", "b", "a", "b"]

    def rows() -> list[dict[str, Any]]:
        return [
            {"request_uuid": f"r{i}", "start_ns": i, "workflow_run_id": "w", "agent_id": agent}
            for i, agent in enumerate(agents)
        ]

    want = with_divergence(rows(), {f"r{i}": p for i, p in enumerate(ps)})
    assert [r["first_divergence_same_agent"] for r in want] == [None, 1, None, 1, 3, 0, 0]
    assert [r["first_divergence_previous_agent"] for r in want] == [None, 1, 2, 1, 1, 0, 0]
    for dtype in DTYPES:
        tokens = {f"r{i}": a for i, a in enumerate(as_dtype(ps, dtype))}
        assert with_divergence(rows(), tokens) == want, dtype
