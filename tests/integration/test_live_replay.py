"""`kvscope replay RUN --live` on the real engine: the shipped pathology run (27 blocks, LRU evicts
the next agent's prefix) replayed on the session's engine (8,192 tokens): the harmful evictions
are gone, every later turn hits its whole fixed prompt, as the simulator predicts, and the rows
carry the original agents, turns and transitions."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import ROOT, Up

pytestmark = pytest.mark.engine
SOURCE = ROOT / "tests" / "fixtures" / "replay" / "pathology"
FIXED = 7 * 128  # seven full blocks of vLLM CPU's 128 tokens


def test_pathology_replayed_at_a_larger_capacity(up: Up, tmp_path: Path) -> None:
    engine = up.engine_file(tmp_path)  # the session engine, reused
    runs = tmp_path / "runs"
    result = up.cli("replay", str(SOURCE), "--live", "--engine", str(engine),
                    "--runs-dir", str(runs), timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = runs.glob("replay-pathology-*")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["replay_of"] == str(SOURCE) and info["replay"]["pacing"] == "session"
    rows = sorted(pq.read_table(run_dir / "requests.parquet").to_pylist(),
                  key=lambda r: r["start_ns"])  # fmt: skip
    original = [json.loads(line) for line in (SOURCE / "requests.jsonl").read_text().splitlines()]
    key = ("agent_id", "previous_agent_id", "turn_id", "prompt_tokens", "output_tokens")
    assert [tuple(r[k] for k in key) for r in rows] == [tuple(o[k] for k in key) for o in original]
    assert all(r["status"] == "ok" for r in rows)
    assert [r["cached_tokens"] for r in rows] == [0] * 4 + [FIXED] * 8  # was 640 at 27 blocks
    doc = json.loads((run_dir / "live_replay.json").read_text())
    assert doc["harmful_evictions"] == 0 and doc["predicted"]["harmful_evictions"] == 0
    assert doc["agent_order_same"]
    for agent, v in doc["per_agent"].items():
        assert v["replay"]["cached_tokens"] == v["predicted"]["cached_tokens"] == 2 * FIXED, agent
        assert v["original"]["cached_tokens"] == 2 * 640
