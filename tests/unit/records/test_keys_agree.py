"""One block-key definition (records.blockkey): a finalized run's keys and a replay's compare.

finalize keys the engine's stored blocks (the KV events' token ids, chained in the ledger) and
the requests' prompt blocks (piecehash on the distinct pieces); the replay simulator keys the
prompts with sim.trace.chain_keys. All of them are records.blockkey's keys, so the same tokens
give the same keys whichever computes them.
"""

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import ROOT

from kvscope.finalize import finalize, piecehash
from kvscope.finalize.kvcolumns import read_columns
from kvscope.finalize.ledger import KEYED, ledger_of
from kvscope.finalize.prompts import load_prompts
from kvscope.records import blockkey
from kvscope.records.blocks import BLOCKS_PARQUET
from kvscope.records.kv_events import events_path
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.trace import chain_keys

FIXTURES = ROOT / "tests" / "fixtures" / "replay"


@pytest.mark.parametrize("name", ["pathology", "demo-sglang"])  # vLLM 128-token blocks; SGLang 1
def test_a_replay_of_a_finalized_run_uses_the_keys_finalize_gave_its_blocks(
    name: str, tmp_path: Path
) -> None:
    run = Path(shutil.copytree(FIXTURES / name, tmp_path / name))
    finalize(run)
    trace = load_source(run).trace
    assert len(trace) and len(trace.keys)

    # the requests' prompt blocks: finalize's keys (on distinct pieces) are the replay's
    named = load_prompts(run).named(trace.request_ids)
    keys, _, offsets = piecehash.prompt_blocks(named, trace.block_size, hashes=False)
    assert np.array_equal(offsets, trace.offsets)
    assert np.array_equal(keys, trace.keys)

    # the engine's stored blocks (the ledger finalize builds from the KV events)
    ledger = ledger_of(read_columns(events_path(run)))
    assert ledger.block_size == trace.block_size
    keyed = ledger.key_state == KEYED
    assert np.isin(trace.keys, ledger.key[keyed]).all()  # every prompt block was stored

    # a life stored by a request (blocks.parquet: one row per ledger life, the owner from the
    # engine's session id, not from tokens) holds one of its prompt's keys, or an output block
    owners = pq.read_table(run / BLOCKS_PARQUET)["owner_request_uuid"].to_pylist()
    assert len(owners) == len(ledger)
    at = {u: i for i, u in enumerate(trace.request_ids)}
    matched = 0
    for life in np.flatnonzero(keyed).tolist():
        i = at.get(owners[life])
        if i is None:
            continue
        if ledger.key[life] in trace.blocks_of(i):
            matched += 1
        else:  # past the prompt's full blocks: its last partial block and the output
            tail = int(trace.prompt_tokens[i]) % trace.block_size + int(trace.output_tokens[i])
            assert tail >= trace.block_size
    assert matched >= len(np.unique(trace.keys))  # each distinct prompt block stored at least once


def test_chain_keys_are_the_block_keys() -> None:
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 1 << 17, size=n) for n in (0, 3, 16, 40, 129)]
    keys, offsets = chain_keys(prompts, 8)
    want, _, want_offsets = blockkey.prompt_blocks(prompts, 8, hashes=False)
    assert np.array_equal(keys, want) and np.array_equal(offsets, want_offsets)
    assert keys.dtype == np.uint64 and offsets.dtype == np.int64


def test_ids_of_mixed_dtypes_give_the_same_keys() -> None:
    """uint64 ids beside int64 ones (numpy would promote their concatenation to float64, which
    loses ids past 2**53): an id is taken modulo 2**64, whatever its dtype."""
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 1 << 16, size=n) for n in (20, 33, 8)]
    prompts[0][:3] = [-1, -(1 << 62) - 3, (1 << 62) + 5]  # uint64: 2**64 - 1, ...
    want, _, _ = blockkey.prompt_blocks(prompts, 4, hashes=False)
    mixed = [prompts[0].view(np.uint64), prompts[1], prompts[2].astype(np.uint16)]
    got, _, _ = blockkey.prompt_blocks(mixed, 4, hashes=False)
    assert np.array_equal(got, want)
    as_lists = [p.tolist() for p in prompts]
    assert np.array_equal(chain_keys(as_lists, 4)[0], want)
