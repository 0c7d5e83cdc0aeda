"""A run directory's replayable calls as the trace formats `load_source` reads.

`mooncake_rows(source)`: one Mooncake line per request of a loaded run (timestamp and
end_timestamp in ms from the first start; hash_ids: each distinct block key numbered by first
appearance, then a fresh id for a partial last block), with kvscope's request_id, agent,
previous_agent and workflow. `token_rows(source)`: one token-id line per request, with the
run's exact prompt token ids and the same extensions. Replaying either gives the run's replay.
`write_trace(rows, path)` writes them as JSONL, or, for token-id rows and a path ending in
.arrow, as an Arrow IPC stream (sim/inputs/arrow_tokens.py reads it without parsing text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.errors import KvscopeError
from kvscope.sim.inputs.sources import Source


def _common(source: Source, i: int) -> dict[str, Any]:
    t = source.trace
    t0 = float(t.start_s[0]) if len(t) else 0.0
    return {
        "request_id": t.request_ids[i],
        "timestamp": (float(t.start_s[i]) - t0) * 1e3,
        "end_timestamp": (float(t.end_s[i]) - t0) * 1e3,
        "agent": t.agents[i],
        "previous_agent": t.previous_agents[i],
        "workflow": t.workflows[i],
    }


def mooncake_rows(source: Source) -> list[dict[str, Any]]:
    t = source.trace
    ids: dict[int, int] = {}
    fresh = 0  # ids of partial last blocks, after every key's
    rows = []
    for i in range(len(t)):
        hash_ids = [ids.setdefault(int(k), len(ids)) for k in t.blocks_of(i)]
        blocks = -(-int(t.prompt_tokens[i]) // t.block_size)
        while len(hash_ids) < blocks:  # the partial last block: content of its own
            fresh += 1
            hash_ids.append(-fresh)
        rows.append(
            {
                **_common(source, i),
                "input_length": int(t.prompt_tokens[i]),
                "output_length": int(t.output_tokens[i]),
                "hash_ids": hash_ids,
            }
        )
    for row in rows:  # fresh ids numbered after the keys' ids
        row["hash_ids"] = [h if h >= 0 else len(ids) - h - 1 for h in row["hash_ids"]]
    return rows


def token_rows(source: Source) -> list[dict[str, Any]]:
    if source.run is None:
        raise KvscopeError("token-id lines need a run directory's prompt token ids")
    tokens = source.run.tokens
    t = source.trace
    return [
        {
            **_common(source, i),
            "token_ids": np.asarray(tokens[t.request_ids[i]]).tolist(),
            "output_length": int(t.output_tokens[i]),
        }
        for i in range(len(t))
    ]


ARROW_SUFFIX = ".arrow"


def write_trace(rows: list[dict[str, Any]], path: Path) -> Path:
    """`rows` as JSONL, or as Arrow where `path` ends in .arrow (token-id rows only)."""
    if path.suffix != ARROW_SUFFIX:
        return write_jsonl(rows, path)
    if rows and "token_ids" not in rows[0]:
        raise KvscopeError(f"{path}: only a token-id trace is written as Arrow; use .jsonl")
    import pyarrow as pa

    labels = ("request_id", "agent", "previous_agent", "workflow")
    schema = pa.schema(
        [(name, pa.string()) for name in labels]
        + [("timestamp", pa.float64()), ("end_timestamp", pa.float64())]
        + [("output_length", pa.int64()), ("token_ids", pa.list_(pa.int64()))]
    )
    table = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table, max_chunksize=4096)
    return path


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    return path
