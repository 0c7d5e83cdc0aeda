"""The per-call priorities the replay's SGLang priority policies evict by.

- `priority` (sglang): the priorities the trace's calls carried (`Trace.priorities`; all 0
  without them, SGLang's reading of a call that carried none). Replaying a run recorded with
  eviction hints under its own policy so reproduces what the engine did.
- `priority-hints`: the same, named: refused when the calls carried none.
- `steps-to-execution-hints`, `predicted-next-hints`: as if the run had been profiled with
  `eviction_hints` of that name: records/priorities.py's levels computed offline over the
  trace's calls in their start order, each at its start (the idle rule's clock), its workflow
  the call's workflow_run_id. The probe computes them at the send, which may order concurrent
  calls slightly otherwise.
All of them are SGLang's radix cache (`--radix-eviction-policy priority`): the vLLM block pool
has no per-request priority, so they are refused on its semantics.
"""

from __future__ import annotations

import numpy as np

from kvscope.errors import KvscopeError
from kvscope.records.priorities import IDLE_S, LEVEL_POLICIES, make_levels
from kvscope.sim.trace import Trace

# replay policy -> records.priorities' level policy (None: the recorded priorities)
HINT_POLICIES: dict[str, str | None] = {
    "priority-hints": None,
    **{f"{level}-hints": level for level in LEVEL_POLICIES},
}


def offline_priorities(trace: Trace, level_policy: str, idle_s: float = IDLE_S) -> np.ndarray:
    """Each request's level under `level_policy`, computed over the calls in start order."""
    levels = make_levels(level_policy, idle_s)
    out = np.zeros(len(trace), dtype=np.int64)
    for i in np.argsort(trace.start_s, kind="stable").tolist():
        agent, previous, workflow = trace.agents[i], trace.previous_agents[i], trace.workflows[i]
        out[i] = levels(agent, previous, workflow, float(trace.start_s[i]))
    return out


def check_hints(policy: str, trace: Trace, engine: str | None) -> None:
    """A KvscopeError when `policy` (one of HINT_POLICIES) cannot be replayed on `engine`
    semantics (None: SGLang's, chosen for it) over `trace`."""
    if engine not in (None, "sglang"):
        raise KvscopeError(
            f"policy {policy!r} is SGLang's priority eviction (--radix-eviction-policy priority); "
            "the vLLM block pool has no per-request priority (its free queue is LRU): "
            "replay a run recorded on SGLang"
        )
    if HINT_POLICIES[policy] is None and trace.priorities is None:
        raise KvscopeError(
            "this run's calls carried no engine priority: profile it with eviction_hints "
            "(steps-to-execution or predicted-next, on SGLang), or replay "
            "steps-to-execution-hints / predicted-next-hints, which compute them offline"
        )


def hint_priorities(policy: str, trace: Trace, engine: str | None) -> np.ndarray:
    """The priorities `policy` (one of HINT_POLICIES) replays `trace` with."""
    check_hints(policy, trace, engine)
    level_policy = HINT_POLICIES[policy]
    if level_policy is None:
        assert trace.priorities is not None
        return trace.priorities
    return offline_priorities(trace, level_policy)
