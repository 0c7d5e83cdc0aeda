"""The compiled block keys (sim/inputs/chain_kernel.py) are records.blockkey's, and a token-id
trace loads to the same Trace whether its prompts are hashed by numpy or compiled."""

import json
from pathlib import Path

import numpy as np
import pytest

from kvscope.records import blockkey
from kvscope.sim.caches import compiled
from kvscope.sim.inputs.chain_kernel import keys_of
from kvscope.sim.inputs.rows import Flat
from kvscope.sim.inputs.sources import load_source


@pytest.mark.parametrize("size", [1, 3, 16, 64])
@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.uint32, np.int32, np.uint16])
def test_compiled_keys_are_blockkeys_keys(size: int, dtype: type) -> None:
    rng = np.random.default_rng(size)
    counts = rng.integers(0, 9 * size, size=300)
    counts[:5] = [0, size - 1, size, 4 * size, 4 * size + 1]  # empty, partial, whole, 4 at once
    info = np.iinfo(dtype)
    flat = rng.integers(max(info.min, -(1 << 62)), min(info.max, 1 << 62), size=int(counts.sum()))
    flat = flat.astype(dtype)
    want, _, offsets = blockkey.prompt_blocks(Flat(flat, counts), size, hashes=False)
    keys, per_prompt = keys_of(flat, counts, size)
    assert keys.dtype == np.uint64 and np.array_equal(keys, want)
    assert np.array_equal(per_prompt, np.diff(offsets))


def test_a_token_trace_loads_the_same_hashed_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(7)
    shared = rng.integers(0, 50_000, size=40).tolist()
    rows = [
        {"request_id": f"r{i}", "token_ids": shared[: rng.integers(0, 40)] + [i] * (i % 7)}
        for i in range(200)
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    by_numpy = load_source(path, block_size=4).trace
    monkeypatch.setattr(compiled, "COMPILED_FROM_BLOCKS", 1)
    by_kernel = load_source(path, block_size=4).trace
    assert len(by_numpy.keys) > 100
    assert np.array_equal(by_numpy.keys, by_kernel.keys)
    assert np.array_equal(by_numpy.offsets, by_kernel.offsets)
