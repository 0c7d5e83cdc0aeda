"""Two tiers in numbers: per agent, the prompt tokens hit on the device, loaded from the host
(of those, prefetched before the call) and missed; and the load time the host hits cost.

`tier_numbers(trace, result, agents, load_ms_per_block)` -> the `tiers` record of a replay with
a host tier (None without one): {host_tokens, prefetched_tokens, load_ms, load_ms_per_block,
per_agent: {agent: {device_tokens, host_tokens, prefetched_tokens, missed_tokens, load_ms}}};
missed = prompt - device - host (recomputed).
`load_ms` = load_ms_per_block x the host blocks that were not prefetched (a prefetch loads off
the call's critical path, KVFlow's point); null when no per-block cost was given.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvscope.sim.caches.result import SimResult
from kvscope.sim.trace import Trace

FIELDS = ("device_tokens", "host_tokens", "prefetched_tokens", "missed_tokens")


def tier_numbers(
    trace: Trace, result: SimResult, agents: list[str], load_ms_per_block: float | None
) -> dict[str, Any] | None:
    """See the module doc; `agents[i]`: request i's agent label."""
    if result.prefetched_blocks is None:
        return None
    bs = trace.block_size
    prompt = trace.prompt_tokens.astype(np.int64)
    device = np.minimum(result.cached_blocks * bs, prompt)
    host = np.minimum(result.host_blocks * bs, prompt - device)
    fetched = np.minimum(np.asarray(result.prefetched_blocks) * bs, host)
    per_agent: dict[str, dict[str, Any]] = {}
    for i, agent in enumerate(trace.agents):
        row = per_agent.setdefault(
            "(no agent)" if agent is None else agent,
            dict.fromkeys(
                ("device_tokens", "host_tokens", "prefetched_tokens", "missed_tokens"), 0
            ),
        )
        row["device_tokens"] += int(device[i])
        row["host_tokens"] += int(host[i])
        row["prefetched_tokens"] += int(fetched[i])
        row["missed_tokens"] += int(prompt[i] - device[i] - host[i])
    for row in per_agent.values():  # what the host hits cost the calls (prefetched: nothing)
        unfetched = (row["host_tokens"] - row["prefetched_tokens"]) / bs
        row["load_ms"] = None if load_ms_per_block is None else load_ms_per_block * unfetched
    unfetched_blocks = int((result.host_blocks - np.asarray(result.prefetched_blocks)).sum())
    return {
        "host_tokens": int(host.sum()),
        "prefetched_tokens": int(fetched.sum()),
        "load_ms_per_block": load_ms_per_block,
        "load_ms": None if load_ms_per_block is None else load_ms_per_block * unfetched_blocks,
        "per_agent": per_agent,
    }
