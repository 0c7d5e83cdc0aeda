"""sim/inputs/run_keys.py: a run's prompt-token stream read as block keys, a chunk at a time."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import ROOT

from kvscope.records.base import ArrowBatches, ArrowWriter, joined
from kvscope.records.tokens import (
    TOKENS_ARROW,
    TOKENS_SCHEMA,
    PromptTokenIds,
    common_prefix,
    load_tokens,
)
from kvscope.sim.inputs.run_keys import PromptKeys, common_blocks
from kvscope.sim.trace import chain_keys

PATHOLOGY = ROOT / "tests" / "fixtures" / "replay" / "pathology"


def _prompts(rng: np.random.Generator, n: int, high: int) -> list[list[int]]:
    """Prompts that share prefixes of random lengths with earlier ones."""
    out: list[list[int]] = []
    for _ in range(n):
        base = out[rng.integers(len(out))] if out and rng.random() < 0.7 else []
        keep = int(rng.integers(len(base) + 1))
        out.append(base[:keep] + rng.integers(0, high, int(rng.integers(0, 90))).tolist())
    return out


def _write(run: Path, records: list[tuple[str, list[int] | None]]) -> None:
    run.mkdir()
    to_batch = PromptTokenIds.to_batch
    with ArrowWriter[PromptTokenIds](run / TOKENS_ARROW, TOKENS_SCHEMA, to_batch) as w:
        for uuid, ids in records:
            if ids is None:  # a record with null token_ids
                w.append_batch(
                    pa.RecordBatch.from_arrays(
                        [pa.array([uuid]), pa.array([None], TOKENS_SCHEMA.field(1).type)],
                        schema=TOKENS_SCHEMA,
                    )
                )
            else:
                w.append(PromptTokenIds(uuid, tuple(ids)))


@pytest.mark.parametrize("high", [50, 70_000])  # uint16 ids, and ids beyond 2**16
def test_keys_are_chain_keys_of_the_stream_read_a_few_records_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, high: int
) -> None:
    monkeypatch.setattr(ArrowBatches, "chunks", lambda self, nbytes=0: joined(self, 600))
    rng = np.random.default_rng(high)
    prompts = _prompts(rng, 60, high)
    records: list[tuple[str, list[int] | None]] = [(f"c{i}", p) for i, p in enumerate(prompts)]
    records += [("c3", [7] * 40), ("gone", None)]  # c3 written twice: the last one counts
    _write(tmp_path / "run", records)
    keys = PromptKeys.read(tmp_path / "run", 8)
    tokens = load_tokens(tmp_path / "run")
    assert "gone" not in keys and "gone" not in tokens and "c0" in keys
    assert len(tokens) == 60
    for uuid, ids in tokens.items():
        want, _ = chain_keys([ids.astype(np.int64)], 8)
        assert np.array_equal(keys.of(uuid), want), uuid
        assert keys.tokens(uuid) == len(ids)
    assert keys.tokens("c3") == 40


def test_a_legacy_jsonl_stream_reads_the_same_keys() -> None:
    keys = PromptKeys.read(PATHOLOGY, 128)
    tokens = load_tokens(PATHOLOGY)
    assert len(tokens) == 12
    for uuid, ids in tokens.items():
        assert np.array_equal(keys.of(uuid), chain_keys([ids.astype(np.int64)], 128)[0])


def test_common_blocks_are_the_full_blocks_of_the_common_prefix() -> None:
    rng = np.random.default_rng(1)
    prompts = [np.array(p, dtype=np.int64) for p in _prompts(rng, 80, 5)]
    keys = [chain_keys([p], 4)[0] for p in prompts]
    pairs = rng.integers(0, len(prompts), (300, 2))
    shared = 0
    for i, j in pairs:
        want = min(common_prefix(prompts[i], prompts[j]), len(prompts[i]), len(prompts[j])) // 4
        assert common_blocks(keys[i], keys[j]) == want
        shared += want > 0 and i != j
    assert shared > 20  # the pairs did share blocks
