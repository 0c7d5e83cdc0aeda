"""The trace the simulator replays: one row per request, prompts as chained block keys.

A block key identifies a full block of `block_size` prompt tokens *and its whole prefix*: two
requests share their k-th key exactly when their first k blocks are token for token the same
(the chaining vLLM and SGLang hash with). Keys come from token ids (`chain_keys`) or are given
(a Mooncake trace's `hash_ids`). Blocks are stored flat: request i's keys are
`keys[offsets[i]:offsets[i + 1]]` (CSR), so a 100k-request trace is a few numpy arrays.

Timing: `start_s` is when the engine began the request (its blocks are taken), `end_s` when
it finished (its blocks become evictable); both in seconds on one clock. `end_s` equal to
`start_s` (a trace without durations) releases a request before the next one starts.
A value that was not measured is NaN (floats) or None (labels), never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvscope.records.requests import transition_label

_MASK = (1 << 64) - 1
_BASE = 0x9E3779B97F4A7C15  # odd: invertible modulo 2**64
_BASE_INV = pow(_BASE, -1, 1 << 64)


def _weights(block_size: int) -> np.ndarray:
    rng = np.random.default_rng(0x6B7673636F7065)  # fixed: keys are comparable across calls
    return rng.integers(1, 1 << 63, size=block_size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def chain_keys(
    token_ids: Sequence[Sequence[int]] | Sequence[np.ndarray], block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Chained keys of every full block of every prompt, vectorised: (keys uint64, offsets int64).

    key_k = sum_{j<=k} c_j * B^(k-j) mod 2**64, where c_j is a random linear hash of block j's
    tokens; computed as B^k * cumsum(c_j * B^-j) per request, so no Python loop runs per block.
    """
    counts = np.array([len(t) // block_size for t in token_ids], dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.zeros(0, dtype=np.uint64), offsets
    blocks = np.concatenate(
        [
            np.asarray(t[: n * block_size], dtype=np.int64).reshape(n, block_size).astype(np.uint64)
            for t, n in zip(token_ids, counts, strict=True)
            if n
        ]
    )
    with np.errstate(over="ignore"):
        content = (blocks * _weights(block_size)).sum(axis=1, dtype=np.uint64)
        local = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], counts)
        powers_inv = _powers(_BASE_INV, int(counts.max()))[local]
        powers = _powers(_BASE, int(counts.max()))[local]
        running = np.cumsum(content * powers_inv, dtype=np.uint64)
        base = np.repeat(np.concatenate([[np.uint64(0)], running])[offsets[:-1]], counts)
        keys = (running - base) * powers
    return keys, offsets


def _powers(base: int, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    p = 1
    for i in range(n):
        out[i] = p
        p = (p * base) & _MASK
    return out


@dataclass(frozen=True)
class Trace:
    """A request trace in block form (see the module docstring for the contract)."""

    source: str  # a path or a description
    block_size: int
    request_ids: tuple[str, ...]
    start_s: np.ndarray  # float64
    end_s: np.ndarray  # float64, >= start_s
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    keys: np.ndarray  # uint64, chained block keys of the full prompt blocks, flat
    offsets: np.ndarray  # int64, len n + 1
    agents: tuple[str | None, ...]
    workflows: tuple[str | None, ...]
    previous_agents: tuple[str | None, ...]
    measured_cached_tokens: np.ndarray | None = None  # float64, NaN: not measured; None: no engine
    capacity_tokens: int | None = None  # the run's KV capacity
    engine: str | None = None  # "vllm" | "sglang": the engine the trace was recorded on

    def __len__(self) -> int:
        return len(self.request_ids)

    def blocks_of(self, i: int) -> np.ndarray:
        return self.keys[self.offsets[i] : self.offsets[i + 1]]

    def transition(self, i: int) -> str | None:
        """ "previous agent -> agent" (records.requests.transition_label); None without an agent."""
        agent = self.agents[i]
        return None if agent is None else transition_label(self.previous_agents[i], agent)
