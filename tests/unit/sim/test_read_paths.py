"""A trace's chunk read a column at a time (sim/inputs/jsonl.py `_mooncake_whole`,
`_tokens_whole`) gives the Trace that reading it line by line (`_mooncake_lines`,
`_tokens_lines`) gives, on random valid traces in every form the fast path takes: ids named
or not, end times missing, null, or before the start, lengths off the block size, the last
partial block's id given or not, output lengths missing."""

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from kvscope.sim.inputs import chunks, jsonl
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.trace import Trace

BS = 4


def _mooncake(rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
    named, rows, t = rng.random() < 0.5, [], 0.0
    for i in range(n):
        t += float(rng.exponential(5.0))
        length = int(rng.integers(0, 40))
        blocks = length // BS + (1 if length % BS and rng.random() < 0.5 else 0)
        row: dict[str, Any] = {"timestamp": round(t, 3) if rng.random() < 0.7 else int(t)}
        row |= {"input_length": length, "output_length": int(rng.integers(0, 9))}
        row["hash_ids"] = rng.integers(0, 12, size=blocks).tolist()  # shared prefixes, repeats
        end = rng.random()
        if end < 0.3:
            row["end_timestamp"] = round(t + float(rng.exponential(20.0)), 3)
        elif end < 0.4:
            row["end_timestamp"] = None
        elif end < 0.5:
            row["end_timestamp"] = round(t - 1.0, 3)  # before the start: the start
        if named:
            row["request_id"] = f"q{i}"
        rows.append(row)
    return rows


def _tokens(rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
    timed, rows = rng.random() < 0.7, []
    for i in range(n):
        row: dict[str, Any] = {"request_id": f"r{i}" if rng.random() < 0.8 else i}
        row["token_ids"] = rng.integers(0, 6, size=int(rng.integers(0, 30))).tolist()
        if timed:
            row["timestamp"] = float(i) * 3.5 if rng.random() < 0.9 else None
        if rng.random() < 0.8:
            row["output_length"] = int(rng.integers(0, 9))
        if rng.random() < 0.3:
            row["end_timestamp"] = float(i) * 3.5 + 10.0
        rows.append(row)
    return rows


def _fields(trace: Trace) -> dict[str, Any]:
    arrays = ("start_s", "end_s", "prompt_tokens", "output_tokens", "keys", "offsets")
    return {
        "ids": list(trace.request_ids),
        **{name: np.asarray(getattr(trace, name)).tolist() for name in arrays},
        "agents": trace.agents,
    }


@pytest.mark.parametrize("kind", ["mooncake", "tokens"])
@pytest.mark.parametrize("seed", range(8))
def test_the_column_path_reads_as_the_line_path(
    tmp_path: Path, kind: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(seed)
    rows = (_mooncake if kind == "mooncake" else _tokens)(rng, 300)
    path = tmp_path / f"{kind}.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    monkeypatch.setattr(chunks, "CHUNK_BYTES", int(rng.choice([300, 5000, 1 << 20])))
    whole = getattr(jsonl, f"_{kind}_whole")
    taken: list[bool] = []  # whether each chunk took the column path
    monkeypatch.setattr(jsonl, f"_{kind}_whole", lambda *a: taken.append(bool(r := whole(*a))) or r)
    fast = load_source(path, block_size=BS)
    assert any(taken)  # the fast path ran
    monkeypatch.setattr(jsonl, "_mooncake_whole", lambda *_a: None)
    monkeypatch.setattr(jsonl, "_tokens_whole", lambda *_a: None)
    slow = load_source(path, block_size=BS)
    assert _fields(fast.trace) == _fields(slow.trace)
    assert fast.notes == slow.notes
    assert len(fast.trace) == len(rows)
