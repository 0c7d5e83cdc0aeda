"""What one simulation returns: per-request hits and the evictions that cost a later request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SimResult:
    """One policy at one capacity over one trace.

    `cached_blocks[i]`: full prompt blocks request i found on the device (its cached tokens are
    `cached_blocks[i] * block_size`). `host_blocks[i]`: the blocks after those found in the host
    tier (zeros without one). Harm rows, one per (needing request, evictor request, owner
    request): `harm_blocks` blocks of the needing request's prompt that had been cached, were
    evicted by the evictor's allocation, and had to be recomputed.
    `preempted[i]`: request i could not get all its blocks (the pool was pinned by running
    requests; an engine would have preempted). `prefetched_blocks[i]`: of its host blocks, those
    a KVFlow-style prefetch had loaded before the call (None without a host tier).
    """

    policy: str
    capacity_blocks: int
    block_size: int
    cached_blocks: np.ndarray  # int64, per request
    host_blocks: np.ndarray  # int64, per request
    preempted: np.ndarray  # bool, per request
    harm_request: np.ndarray  # int64 request index that recomputed
    harm_evictor: np.ndarray  # int64 request index whose allocation evicted (-1: unknown)
    harm_owner: np.ndarray  # int64 request index that stored the block (-1: unknown)
    harm_blocks: np.ndarray  # int64
    evictions: int  # keyed blocks evicted in all
    seconds: float  # wall time of the simulation
    prefetched_blocks: np.ndarray | None = None  # int64, per request; None: no host tier
    engine: str = "vllm"  # the cache semantics replayed: "vllm" (block pool) or "sglang" (radix)
    # what the cache held: "cache-outputs" (the engine's: a request's output blocks take space
    # and are kept) or "prompt-only" (prompts' full blocks only: simulate's cache_outputs=False)
    caching: str = "cache-outputs"
    # which of a request's blocks is evicted first: "tail-first" (the engines') or "head-first"
    in_request: str = "tail-first"
    attributed: bool = True  # False: evictions were not attributed (no harm rows: not measured)

    @property
    def cached_tokens(self) -> np.ndarray:
        return self.cached_blocks * self.block_size
