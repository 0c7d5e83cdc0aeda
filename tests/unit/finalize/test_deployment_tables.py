"""Finalize of a deployment's run directory: each replica's streams in replicas/<name>/.

The calls and KV events of test_routing (two replicas, block size 4), written as a run would
write them: requests.jsonl without the replica, prompt_tokens.jsonl, and per replica its
engine.log, kv_events.jsonl and /metrics instants. Finalize must place each call on its replica
(log line, else the replica's KV events), take its provenance from that replica's blocks only,
its /metrics context from that replica's series, and add the routing misses.
"""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from test_routing_misses import R0, R1, ROWS, TOKENS

from kvscope.finalize import finalize
from kvscope.records import requests
from kvscope.records.finalized import Finalized
from kvscope.records.kv_events import KV_EVENTS_JSONL, KV_EVENTS_PARQUET, KvBatch, KvEvent
from kvscope.records.metrics import METRICS_JSONL
from kvscope.records.run_dir import ENGINE_LOG, replica_dir, replica_dirs
from kvscope.records.tokens import TOKENS_JSONL

# Where each call's log line is: A is in no log (it stored blocks on r0: placed by its KV events),
# G in none and stored nothing (unknown). F failed on r1.
LOGGED = {"r0": ["D", "E"], "r1": ["B", "C", "F"]}
USED = {"r0": 1000, "r1": 2000}  # each replica's kv_used_tokens, all run long
# each replica's prompt and cached token counters at the end (0 at the start): r0 counted what
# its calls A, D, E report (41, 20); r1 two cached tokens more than its B and C report (27, 8)
COUNTED = {"r0": (41, 20), "r1": (27, 10)}


def full(r: dict[str, Any]) -> dict[str, Any]:
    base = {c: None for c in requests.COLUMNS} | {
        "benchmark_run_id": "run", "experiment_name": "x", "configuration_hash": "h",
        "timestamp": "2026-11-25T00:00:00Z", "workflow_type": "peer", "model_name": "m",
    }  # fmt: skip
    return base | {k: v for k, v in r.items() if k != "replica"}


def write_run(root: Path) -> Path:
    with (root / requests.REQUESTS_JSONL).open("w") as f:
        for r in ROWS:
            f.write(json.dumps(full(r)) + "\n")
    with (root / TOKENS_JSONL).open("w") as f:
        for uuid, ids in TOKENS.items():
            f.write(json.dumps({"request_uuid": uuid, "token_ids": ids}) + "\n")
    for name, events in (("r0", R0), ("r1", R1)):
        folder = replica_dir(root, name)
        folder.mkdir(parents=True)
        with (folder / KV_EVENTS_JSONL).open("w") as f:
            for b, e in events:
                f.write(json.dumps(batch(b, e).to_dict()) + "\n")
        lines = [f"INFO Added request chatcmpl-{u}-0123abcd." for u in LOGGED[name]]
        (folder / ENGINE_LOG).write_text("\n".join(["INFO starting", *lines]) + "\n")
        with (folder / METRICS_JSONL).open("w") as f:
            for ts, (prompt, cached) in ((-5, (0, 0)), (100, COUNTED[name])):
                values = {"kv_used_tokens": USED[name], "prompt_tokens_total": prompt,
                          "cached_tokens_total": cached}  # fmt: skip
                f.write(json.dumps({"ts": ts, "values": values}) + "\n")
    return root


def batch(b: KvBatch, e: KvEvent) -> KvBatch:
    return replace(b, received_ns=b.ts_ns, events=(e,))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Finalized]:
    root = write_run(tmp_path_factory.mktemp("deployment"))
    return root, finalize(root)


@pytest.fixture(scope="module")
def rows(run: tuple[Path, Finalized]) -> dict[str, dict[str, Any]]:
    table = requests.load_table(run[0])
    return {r["request_uuid"]: r for r in table.to_pylist()}


def test_the_replicas_are_found_in_their_folders(run: tuple[Path, Finalized]) -> None:
    assert list(replica_dirs(run[0])) == ["r0", "r1"]


def test_each_call_is_placed_on_its_replica(rows: dict[str, dict[str, Any]]) -> None:
    got = {u: r["replica"] for u, r in rows.items()}
    # A from r0's KV events (no log line); G nowhere: unknown, not guessed
    assert got == {"A": "r0", "B": "r1", "C": "r1", "D": "r0", "E": "r0", "F": "r1", "G": None}


def test_provenance_reads_only_the_serving_replicas_blocks(
    rows: dict[str, dict[str, Any]],
) -> None:
    # C (planner, w1, on r1) was served S, which on r1 the executor B stored: cross-agent. On
    # r0 the same blocks were stored by the planner A of w1 itself: one merged ledger would
    # have called them the planner's own.
    c = rows["C"]
    assert (c["cached_cross_agent_tokens"], c["cached_self_tokens"]) == (8, 0)
    # p and the 2-token tail never seen on r1 (p was on r0: the routing miss below)
    assert (c["uncached_cold_tokens"], c["uncached_evicted_tokens"]) == (6, 0)
    # D (planner, w2, on r0): the 12 block tokens A stored there, another workflow's
    assert rows["D"]["cached_cross_workflow_tokens"] == 12
    assert rows["G"]["cached_self_tokens"] is None  # no replica: no provenance


def test_the_routing_miss_columns(rows: dict[str, dict[str, Any]]) -> None:
    got = {u: (r["routing_miss_tokens"], r["routing_miss_replica"]) for u, r in rows.items()}
    assert got["B"] == (8, "r0") and got["C"] == (4, "r0")
    assert got["D"][0] == 0 and got["E"][0] == 0
    assert got["F"] == (None, None) and got["G"] == (None, None)


def test_the_context_comes_from_the_serving_replicas_series(
    rows: dict[str, dict[str, Any]],
) -> None:
    assert {u: r["cache_used_tokens_before"] for u, r in rows.items()} == {
        "A": 1000, "B": 2000, "C": 2000, "D": 1000, "E": 1000, "F": 2000, "G": None,
    }  # fmt: skip


def test_the_event_and_block_tables_name_the_replica(run: tuple[Path, Finalized]) -> None:
    events = pq.read_table(run[0] / KV_EVENTS_PARQUET).to_pylist()
    assert sorted((e["replica"], e["block_hash"]) for e in events if e["kind"] == "stored") == [
        ("r0", 1), ("r0", 2), ("r0", 3), ("r1", 11), ("r1", 12), ("r1", 13), ("r1", 14),
    ]  # fmt: skip
    blocks = pq.read_table(run[0] / "blocks.parquet").to_pylist()
    assert {(b["replica"], b["block_hash"], b["removal"]) for b in blocks} == {
        ("r0", 1, None), ("r0", 2, None), ("r0", 3, None),
        ("r1", 11, None), ("r1", 12, None), ("r1", 13, "evicted"), ("r1", 14, None),
    }  # fmt: skip


def test_finalize_json_sums_the_replicas(run: tuple[Path, Finalized]) -> None:
    kv = run[1].kv
    assert kv is not None
    assert (kv.batches, kv.events, run[1].blocks) == (4, 4, 7)
    assert kv.skipped == {"failed request": 1, "serving replica unknown": 1}
    assert Finalized.read(run[0]) == run[1]
