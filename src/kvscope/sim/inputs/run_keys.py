"""A run's prompts as block keys, hashed a chunk of the prompt-token stream at a time.

    keys = PromptKeys.read(run_dir, block_size)
    uuid in keys; keys.of(uuid); keys.tokens(uuid)

The stream (records.tokens: one record per call, `token_chunks` a few MB of ids at a time) is
read once; each chunk's prompts are hashed into their full blocks' keys (rows.Hasher:
records.blockkey's keys, the ones `sim.trace.chain_keys` makes) and the ids dropped, so a
replay holds one key per block (8 bytes per block_size tokens) instead of every token id.
A record without ids (null token_ids, a torn record) is not in it; a request_uuid written
twice keeps its last record, as records.tokens.load_tokens does.

Keys are chained (a block's key stands for its whole prefix), so two prompts share their first
k full blocks exactly when their first k keys are equal (`common_blocks`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvscope.records.tokens import token_chunks
from kvscope.sim.inputs.rows import Hasher


class PromptKeys:
    """request_uuid -> its prompt's full-block keys (a view of one flat array) and its length
    in tokens."""

    def __init__(self, keys: np.ndarray, spans: dict[str, tuple[int, int, int]]) -> None:
        self.keys = keys  # every kept record's keys, laid end to end
        self._spans = spans  # uuid -> (first key, last key + 1, prompt length in tokens)

    @classmethod
    def read(cls, run_dir: Path, block_size: int) -> PromptKeys:
        """The run's prompt-token stream hashed (see the module doc)."""
        hasher = Hasher(block_size)
        parts: list[np.ndarray] = []
        spans: dict[str, tuple[int, int, int]] = {}
        done = 0
        for chunk in token_chunks(run_dir):
            lengths = np.where(chunk.valid, chunk.stops - chunk.starts, 0)
            keys, per_prompt = hasher.keys_of(chunk.flat, lengths)
            ends = (done + np.cumsum(per_prompt)).tolist()
            for uuid, ok, end, blocks, length in zip(
                chunk.uuids,
                chunk.valid.tolist(),
                ends,
                per_prompt.tolist(),
                lengths.tolist(),
                strict=True,
            ):
                if ok:
                    spans[uuid] = (end - blocks, end, length)
            parts.append(keys)
            done += len(keys)
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
        return cls(flat, spans)

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._spans

    def of(self, uuid: str) -> np.ndarray:
        """The prompt's full-block keys."""
        lo, hi, _ = self._spans[uuid]
        return self.keys[lo:hi]

    def tokens(self, uuid: str) -> int:
        """The prompt's length in tokens (its ids in the stream)."""
        return self._spans[uuid][2]


def common_blocks(a: np.ndarray, b: np.ndarray) -> int:
    """How many full blocks two prompts share from their start: their equal leading keys."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
