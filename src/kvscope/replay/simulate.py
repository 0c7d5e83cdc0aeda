"""The one entry point every caller uses: `simulate(trace, policy, capacity_blocks)`.

Policies are named here (POLICIES); each returns a `SimResult`. Engine semantics: "vllm" (the
block pool: free queue, any free block evictable) or "sglang" (the radix cache: leaves only).
"""

from __future__ import annotations

from kvscope.replay.reference import simulate_lru
from kvscope.replay.result import SimResult
from kvscope.replay.trace import Trace

POLICIES = ("lru",)
ENGINES = ("vllm",)


def simulate(
    trace: Trace, policy: str, capacity_blocks: int, *, engine: str = "vllm", host_blocks: int = 0
) -> SimResult:
    """Replay `trace` through a prefix cache of `capacity_blocks` blocks under `policy`."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine semantics {engine!r}; known: {', '.join(ENGINES)}")
    if host_blocks:
        raise ValueError("a host tier is not simulated yet")
    return simulate_lru(trace, capacity_blocks)
