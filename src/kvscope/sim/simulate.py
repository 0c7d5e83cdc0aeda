"""The one entry point every caller uses: `simulate(trace, policy, capacity_blocks)`.

Policies are named here (POLICIES); each returns a `SimResult`. Engine semantics: "vllm" (the
block pool: free queue, any free block evictable; pool.py) or "sglang" (the radix cache: only
leaves evictable; radix.py). Policies, with the module that defines each:

- lru (order.py): vLLM's free queue; on "sglang", least recently used leaf first.
  "sglang" runs lru, fifo, lfu, priority, the hint policies and none (radix.py's
  RADIX_POLICIES).
- fifo, lfu, slru, priority (policies.py): by when stored, by uses, two LRU segments, by
  request priority (`priorities`, higher kept longer; default all equal = LRU). On "sglang",
  priority is SGLang's `--radix-eviction-policy priority` with the priorities the trace's calls
  carried (`Trace.priorities`; none: all 0) unless `priorities` are given.
- priority-hints, steps-to-execution-hints, predicted-next-hints (hints.py; "sglang" only):
  SGLang's priority eviction with the priorities the calls carried (refused without them), or
  with eviction hints computed offline as kvscope's probe would have sent them.
- belady (belady.py): the offline optimum heuristic, farthest next use first: an upper bound.
- steps-to-execution (workflow.py): KVFlow's steps-to-execution over the agent step graph.
- predicted-next-agent (workflow.py): PBKV-style next agent, learned online; LRU otherwise.
- none: no prefix cache, the counterfactual (nothing is ever hit).

What the cache holds (CACHING): "cache-outputs", the engine's own (vLLM hashes the output blocks a
request filled and keeps them in its free queue, where they take LRU space though no lookup of a
trace's prompts matches them; SGLang inserts them into its tree), or "prompt-only"
(`cache_outputs=False`: prompts' full blocks only, trace.prompt_only; what kvlint's and
prefixlens' simulators model).

In-request order (IN_REQUEST, vLLM semantics): "tail-first", the engine's (vLLM frees a
request's blocks in reverse, so its last block is the least recent), or "head-first" (its first
block is, as kvlint's and prefixlens' LRU touch a prompt's blocks in order). SGLang's radix
cache evicts leaves, so its order is always tail first.

`sweep_lru(trace, capacities, ...)`: LRU at many capacities in one compiled pass over stack
distances (caches/stack.py), for the capacities where that equals `simulate` exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from kvscope.sim.caches.compiled import worth_compiling
from kvscope.sim.caches.host_tier import HostTier
from kvscope.sim.caches.pool import simulate_pool
from kvscope.sim.caches.radix import RADIX_POLICIES, simulate_radix
from kvscope.sim.caches.result import SimResult
from kvscope.sim.hints import HINT_POLICIES, hint_priorities
from kvscope.sim.orders.base import EvictionOrder, LRUOrder
from kvscope.sim.orders.belady import BeladyOrder
from kvscope.sim.orders.scored import FIFOOrder, LFUOrder, PriorityOrder, SLRUOrder
from kvscope.sim.orders.workflow import PredictedNextAgentOrder, StepsToExecutionOrder
from kvscope.sim.trace import Trace, prompt_only

ORDERS: dict[str, Callable[[], EvictionOrder]] = {
    "lru": LRUOrder,
    "fifo": FIFOOrder,
    "lfu": LFUOrder,
    "slru": SLRUOrder,
    "priority": PriorityOrder,
    "belady": BeladyOrder,
    "steps-to-execution": StepsToExecutionOrder,
    "predicted-next-agent": PredictedNextAgentOrder,
}
POLICIES = (*ORDERS, *HINT_POLICIES, "none")
ENGINES = ("vllm", "sglang")
CACHING = ("cache-outputs", "prompt-only")
IN_REQUEST = ("tail-first", "head-first")  # which of a request's blocks is evicted first


def make_order(policy: str, priorities: Sequence[float] | None = None) -> EvictionOrder:
    """The eviction order named `policy` (not "none")."""
    if policy == "priority":
        return PriorityOrder(priorities)
    return ORDERS[policy]()


def simulate(
    trace: Trace,
    policy: str,
    capacity_blocks: int,
    *,
    engine: str = "vllm",
    host_blocks: int = 0,
    priorities: Sequence[float] | None = None,
    prefetch: bool = False,
    cache_outputs: bool = True,
    in_request: str = "tail-first",
    compiled: bool | None = None,
) -> SimResult:
    """Replay `trace` through a prefix cache of `capacity_blocks` blocks under `policy`.

    `host_blocks` > 0: a host tier of that many blocks below the device ("vllm" only;
    tiers.py), with KVFlow-style prefetch accounting if `prefetch`. `priorities[i]`: request
    i's priority, used by "priority" (and the hint policies) only; on "sglang" the trace's
    own by default. A hint policy the trace or engine cannot replay is a KvscopeError.
    `cache_outputs=False`: the cache holds prompts' full blocks only; `in_request`: which of a
    request's blocks is evicted first (module doc). `compiled`: whether vLLM's pool runs compiled
    where it can (caches/pool.py; None: where the trace is large enough for it to pay).
    """
    if in_request not in IN_REQUEST:
        raise ValueError(f"unknown in-request order {in_request!r}; known: {IN_REQUEST}")
    if in_request != IN_REQUEST[0] and (engine != "vllm" or policy in HINT_POLICIES):
        raise ValueError("a head-first in-request order is simulated on vllm semantics only")
    result = _simulate(
        trace if cache_outputs else prompt_only(trace),
        policy,
        capacity_blocks,
        engine=engine,
        host_blocks=host_blocks,
        priorities=priorities,
        prefetch=prefetch,
        head_first=in_request == IN_REQUEST[1],
        compiled=compiled,
    )
    caching = CACHING[0] if cache_outputs else CACHING[1]
    return replace(result, caching=caching, in_request=in_request)


def sweep_lru(
    trace: Trace,
    capacities: Sequence[int],
    *,
    engine: str = "vllm",
    host_blocks: int = 0,
    cache_outputs: bool = True,
    in_request: str = "tail-first",
) -> tuple[dict[int, SimResult], dict[int, str]]:
    """LRU at many capacities (blocks) in one compiled pass, where that equals `simulate(trace,
    "lru", c, ...)` exactly (caches/stack.py: vLLM semantics, prompt-only caching, no host
    tier, requests that do not overlap in time, ...): ({capacity: its SimResult}, {capacity:
    why it must be simulated on its own}). The caller simulates the capacities of the second."""
    caps = sorted(set(capacities))
    if engine != "vllm" or host_blocks:
        return {}, dict.fromkeys(caps, "only vLLM's block pool without a host tier is a stack")
    if cache_outputs:
        return {}, dict.fromkeys(caps, "output blocks take cache space (--cache-outputs)")
    if in_request not in IN_REQUEST:
        raise ValueError(f"unknown in-request order {in_request!r}; known: {IN_REQUEST}")
    from kvscope.sim.caches.stack import lru_sweep

    found, why = lru_sweep(prompt_only(trace), caps, head_first=in_request == IN_REQUEST[1])
    done = {c: replace(r, caching=CACHING[1], in_request=in_request) for c, r in found.items()}
    return done, why


COMPILED_POLICIES = ("lru", "belady", "none")  # what vLLM's compiled pool runs


def prepare(
    trace: Trace,
    cells: Sequence[tuple[str, int]],
    engine: str | None = None,
    run: Sequence[tuple[str, int]] | None = None,
) -> bool:
    """Whether the (policy, capacity) `cells` of a sweep over `trace` run vLLM's pool compiled
    (their blocks together make it pay: compiled.worth_compiling); if so, and some of the cells
    that still `run` (default: all) are the pool's, its code is loaded and the trace's keys
    factorized now, once (before a grid forks its workers, which inherit it)."""
    n = sum(p in COMPILED_POLICIES for p, _ in cells) if engine in (None, "vllm") else 0
    if not n or not worth_compiling(n * len(trace.keys)):
        return False
    if any(p in COMPILED_POLICIES for p, _ in (cells if run is None else run)):
        from kvscope.sim.caches.pool_compiled import warm

        warm(trace)
    return True


def _simulate(
    trace: Trace,
    policy: str,
    capacity_blocks: int,
    *,
    engine: str,
    host_blocks: int,
    priorities: Sequence[float] | None,
    prefetch: bool,
    head_first: bool,
    compiled: bool | None,
) -> SimResult:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine semantics {engine!r}; known: {', '.join(ENGINES)}")
    if host_blocks and engine != "vllm":
        raise ValueError("a host tier is simulated on vllm semantics only")
    if policy in HINT_POLICIES:
        if engine != "sglang" or priorities is None:  # refused on vllm
            priorities = hint_priorities(policy, trace, engine)
        result = simulate_radix(trace, "priority", capacity_blocks, priorities)
        return replace(result, policy=policy)
    if policy == "none":
        return simulate_pool(
            trace,
            capacity_blocks,
            LRUOrder(),
            caching=False,
            head_first=head_first,
            compiled=compiled,
        )
    host = HostTier(host_blocks, prefetch=prefetch) if host_blocks > 0 else None
    if engine == "sglang":
        if policy not in RADIX_POLICIES:
            raise ValueError(f"{policy!r} is not simulated on sglang; known: {RADIX_POLICIES}")
        if policy == "priority" and priorities is None:
            priorities = trace.priorities
        return simulate_radix(trace, policy, capacity_blocks, priorities)
    order = make_order(policy, priorities)
    return simulate_pool(
        trace, capacity_blocks, order, host=host, head_first=head_first, compiled=compiled
    )
