"""A run directory's replayable calls as the two JSONL trace formats `load_source` reads.

`mooncake_rows(source)`: one Mooncake line per request of a loaded run (timestamp and
end_timestamp in ms from the first start; hash_ids: each distinct block key numbered by first
appearance, then a fresh id for a partial last block), with kvscope's request_id, agent,
previous_agent and workflow. `token_rows(source)`: one token-id line per request, with the
run's exact prompt token ids and the same extensions. Replaying either gives the run's replay.
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


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    return path
