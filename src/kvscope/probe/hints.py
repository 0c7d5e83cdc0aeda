"""Eviction hints: each call's engine priority set from the workflow, so that an unmodified
SGLang (`--radix-eviction-policy priority`) evicts the prefixes needed latest first.

    hints = make_hints("steps-to-execution")   # None for "none"
    priority = hints(identity)                  # an even int >= 2, once per call, at its send

What the engine does with it (SGLang 0.5.23; mem_cache/evict_policy.py PriorityStrategy, the
unified radix tree's insert, unified_radix_cache.checkpoint_into_tree): `priority` is a
top-level int of the request body, kept with priority scheduling off. Every insert (a prompt at
the end of its prefill; prompt and output at the request's finish) sets each node on its path
to max(its priority, the request's); nothing lowers it. Eviction takes the unlocked leaf with
the smallest (priority, last access). At a request's finish its prompt path is inserted again
at priority + 1, so its output goes before its prompt. So a hint acts when a call's prefix is
inserted and a node keeps the highest level any call gave it: a hint is a level, not a
deadline. Levels are even, so a finished prompt's + 1 stays inside its level.

The levels (steps-to-execution: how few steps away the agent is from any in-flight workflow;
predicted-next: how likely it is next; ties by first appearance) are records/priorities.py's,
the same the replay computes offline (`kvscope replay --policy steps-to-execution-hints`). In a
cyclic pathology whose cache holds all prefixes but one, the bottom-ranked prefixes are
recomputed, the others stay, where LRU would cycle through them all.

A workflow is in flight from its first call until it has made no call for `idle_s` (an
invocation's end is not seen here). The state is per process and thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import get_args

from kvscope.probe.identity import CallIdentity
from kvscope.records.priorities import IDLE_S, MAX_AGENTS, HintPolicy, make_levels

__all__ = ["MAX_AGENTS", "POLICIES", "Hints", "make_hints"]

POLICIES: tuple[str, ...] = get_args(HintPolicy)

Hints = Callable[[CallIdentity], int]


def make_hints(
    policy: HintPolicy | None, idle_s: float = IDLE_S, clock: Callable[[], float] = time.monotonic
) -> Hints | None:
    """The policy's per-call priority; None for "none" (no field is sent)."""
    if policy in (None, "none"):
        return None
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction hint policy {policy!r}; one of {', '.join(POLICIES)}")
    levels, lock = make_levels(policy, idle_s), threading.Lock()

    def hints(ident: CallIdentity) -> int:
        with lock:
            workflow = ident.workflow_run_id or ident.thread_id
            return levels(ident.agent_id, ident.previous_agent_id, workflow, clock())

    return hints
