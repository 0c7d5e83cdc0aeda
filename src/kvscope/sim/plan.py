"""What one `kvscope replay` runs: which policies at which capacities, and running them.

Policies: the user's list (an unknown name is a KvscopeError listing simulate.POLICIES), else
the defaults: on a run directory the engine's own policy, steps-to-execution,
predicted-next-agent and Belady (an SGLang run: its own, lru, priority, steps-to-execution-hints
and predicted-next-hints, the policies its radix cache can run: every arm of an eviction-hints
A/B predicted from any one run); on a trace LRU and Belady. A
default not registered in POLICIES yet is skipped with a note, so new policies join without a
change here. The policies that rank blocks by agent (AGENT_POLICIES: steps-to-execution,
predicted-next-agent and the hint policies computed offline) are refused on a trace whose
requests name no agent (they would replay as LRU, silently); as a default they are skipped,
said in a note.
Capacities: the user's list (tokens), else the run's capacity. Each is replayed as
capacity_tokens // block_size blocks (said in a note when that rounds it down; each result keeps
the capacity asked for as requested_capacity_tokens).
Engine semantics: the trace's engine when simulate.ENGINES has it, else the simulator's default
(said in a note); the hint policies (sim/hints.py) are SGLang's, replayed on its semantics when
the trace names no engine and refused on vLLM's, or without the priorities they need. A run
whose calls carried engine priorities is said so: `priority` (SGLang) replays them.
Host tier (optional, vLLM semantics): `host_tokens` // block_size blocks below every replayed
capacity, KVFlow prefetch accounting with `prefetch`, `load_ms_per_block` the cost of a host hit.
The fidelity replay never has one (the engine it is checked against had none).
Caching: the engine's own (output blocks cached, `cache_outputs`, make_plan's default) or
prompt-only (simulate.CACHING), said in a note and in every result; the fidelity replay is
always the engine's own. In-request order (simulate.IN_REQUEST): tail-first (the engines') or
head-first (vLLM semantics only: refused on SGLang's and for the hint policies), said likewise.
Running: LRU's capacities are answered by one compiled pass over stack distances where that is
exact and pays (lru_in_one_pass: vLLM semantics, prompt-only, no host tier, requests one after
another, a large trace), the rest cell by cell (sim.grid); Outcome.notes say which and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from kvscope.errors import KvscopeError
from kvscope.sim.caches.compiled import worth_compiling
from kvscope.sim.grid import run_cells
from kvscope.sim.hints import HINT_POLICIES, check_hints
from kvscope.sim.inputs.sources import Source
from kvscope.sim.results.fidelity import Fidelity, fidelity
from kvscope.sim.results.summary import Summary, summarize
from kvscope.sim.simulate import (
    ENGINES,
    IN_REQUEST,
    POLICIES,
    RADIX_POLICIES,
    prepare,
    simulate,
    sweep_lru,
)

RUN_DEFAULTS = ("steps-to-execution", "predicted-next-agent", "belady")
AGENT_POLICIES = (
    "steps-to-execution",
    "predicted-next-agent",
    *(p for p, level in HINT_POLICIES.items() if level is not None),
)
SGLANG_DEFAULTS = ("lru", "priority", "steps-to-execution-hints", "predicted-next-hints")
TRACE_DEFAULTS = ("lru", "belady")


@dataclass(frozen=True)
class Plan:
    policies: list[str]
    capacities: list[int]  # tokens
    engine: str | None  # passed to simulate() when not None
    notes: list[str]
    host_blocks: int = 0  # a host tier of this many blocks (0: none)
    prefetch: bool = False
    load_ms_per_block: float | None = None
    cache_outputs: bool = True  # False: the cache holds prompts' full blocks only
    in_request: str = "tail-first"  # which of a request's blocks is evicted first


def split_list(text: str | None) -> list[str]:
    """`a,b, c` -> ["a", "b", "c"]; None or "" -> []."""
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def choose_policies(requested: Sequence[str], source: Source) -> tuple[list[str], list[str]]:
    """(policies, notes) as the module doc says."""
    agentless = all(a is None for a in source.trace.agents)
    if requested:
        if unknown := [p for p in requested if p not in POLICIES]:
            raise KvscopeError(f"unknown policy {unknown[0]!r}; known: {', '.join(POLICIES)}")
        if agentless and (needs := [p for p in requested if p in AGENT_POLICIES]):
            raise KvscopeError(
                f"policy {needs[0]!r} ranks blocks by agent, and no request of "
                f"{source.trace.source} names one (it would replay as LRU): give the trace's "
                "lines `agent` and `workflow`, or choose another policy"
            )
        return list(dict.fromkeys(requested)), []
    if source.kind == "run":
        own = source.policy or "lru"
        defaults = [own, *(SGLANG_DEFAULTS if source.trace.engine == "sglang" else RUN_DEFAULTS)]
    else:
        defaults = list(TRACE_DEFAULTS)
    chosen, notes = [], []
    for name in dict.fromkeys(defaults):
        if name not in POLICIES:
            notes.append(f"policy {name!r} skipped: not in this simulator yet")
        elif agentless and name in AGENT_POLICIES:
            notes.append(f"policy {name!r} skipped: no request names an agent (it equals LRU)")
        else:
            chosen.append(name)
    if not chosen:
        raise KvscopeError(f"no default policy is available; choose with --policy {POLICIES}")
    return chosen, notes


def choose_capacities(requested: Sequence[str], source: Source) -> list[int]:
    """Capacities in tokens: the requested ones, else the run's; each at least one block."""
    if not requested:
        if source.trace.capacity_tokens is None:
            raise KvscopeError("the trace has no KV capacity: give --capacity-tokens")
        return [source.trace.capacity_tokens]
    out = []
    for text in requested:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise KvscopeError(f"--capacity-tokens takes integers, got {text!r}") from None
        if value < source.trace.block_size:
            raise KvscopeError(
                f"capacity {value} tokens is less than one block of {source.trace.block_size}"
            )
        out.append(value)
    return list(dict.fromkeys(out))


def make_plan(
    source: Source,
    policies: Sequence[str],
    capacities: Sequence[str],
    host_tokens: int | None = None,
    prefetch: bool = False,
    load_ms_per_block: float | None = None,
    cache_outputs: bool = True,
    in_request: str = IN_REQUEST[0],
) -> Plan:
    chosen, notes = choose_policies(policies, source)
    caps = choose_capacities(capacities, source)
    engine = source.trace.engine
    if engine is not None and engine not in ENGINES:
        notes.append(f"{engine} semantics not simulated yet: replayed as {ENGINES[0]}")
        engine = None
    if engine == "sglang" and (
        other := [p for p in chosen if p not in (*RADIX_POLICIES, *HINT_POLICIES, "none")]
    ):
        raise KvscopeError(
            f"policy {other[0]!r} is not simulated on SGLang's radix cache (this run's engine); "
            f"known there: {', '.join((*RADIX_POLICIES, *HINT_POLICIES, 'none'))}"
        )
    bs = source.trace.block_size
    for cap in caps:
        if cap % bs:
            notes.append(
                f"capacity {cap:,} tokens replayed as {cap // bs:,} whole blocks of {bs} = "
                f"{cap // bs * bs:,} tokens (a cache holds whole blocks)"
            )
    host_blocks = (host_tokens or 0) // bs
    if host_tokens is not None and host_blocks < 1:
        raise KvscopeError(f"--host-tokens {host_tokens} is less than one block of {bs}")
    if host_blocks and engine not in (None, "vllm"):
        raise KvscopeError(f"a host tier is simulated on vllm semantics only, not {engine}")
    if (prefetch or load_ms_per_block is not None) and not host_blocks:
        raise KvscopeError("--prefetch and --host-load-ms need a host tier: give --host-tokens")
    if load_ms_per_block is not None and load_ms_per_block < 0:
        raise KvscopeError("--host-load-ms must be >= 0")
    notes += hint_notes(source, chosen, engine, host_blocks)
    notes.append(caching_note(cache_outputs, engine))
    notes.append(order_note(in_request, engine, chosen))
    return Plan(
        chosen,
        caps,
        engine,
        notes,
        host_blocks,
        prefetch,
        load_ms_per_block,
        cache_outputs,
        in_request,
    )


def order_note(in_request: str, engine: str | None, chosen: list[str]) -> str:
    """Which of a request's blocks is evicted first, in words; a KvscopeError where head-first
    cannot be replayed."""
    if in_request not in IN_REQUEST:
        raise KvscopeError(f"unknown in-request order {in_request!r}; known: {IN_REQUEST}")
    if in_request == IN_REQUEST[0]:
        return (
            "in-request order: tail-first (the engine's: a request's last block is evicted "
            "first); --in-request-order head-first evicts its first block first"
        )
    radix = "the run's engine, SGLang" if engine == "sglang" else None
    radix = radix or next((f"{p!r}, SGLang's" for p in chosen if p in HINT_POLICIES), None)
    if radix:
        raise KvscopeError(
            f"--in-request-order head-first is simulated on vLLM's block pool only, not on "
            f"{radix} radix cache (it evicts leaves: a request's tail first)"
        )
    return (
        "in-request order: head-first: a request's first block is evicted first (as kvlint "
        "and prefixlens), not the engine's last"
    )


def caching_note(cache_outputs: bool, engine: str | None) -> str:
    """What the cache held, in words."""
    if cache_outputs:
        kept = "inserted into the radix tree" if engine == "sglang" else "hashed and kept"
        return (
            f"caching: cache-outputs (the engine's own): a request's output blocks take cache "
            f"space, {kept}, matched by no prompt; --prompt-only for prompts' blocks only"
        )
    return (
        "caching: prompt-only: the cache holds prompts' full blocks only; a request's partial "
        "last block and its output take no space (as kvlint and prefixlens simulate); "
        "--cache-outputs for the engine's own"
    )


def hint_notes(source: Source, chosen: list[str], engine: str | None, host: int) -> list[str]:
    """Refuse a hint policy that cannot be replayed (a KvscopeError); what to note about them."""
    notes = []
    hinted = [p for p in chosen if p in HINT_POLICIES]
    for policy in hinted:
        check_hints(policy, source.trace, engine)
        if host:
            raise KvscopeError(f"{policy!r} is SGLang's; a host tier is simulated on vllm only")
    if hinted and engine is None:
        notes.append(f"{', '.join(hinted)}: SGLang's radix cache (the trace names no engine)")
    carried = source.trace.priorities
    if carried is not None:
        notes.append(
            f"{int((carried != 0).sum())} of {len(carried)} calls carried an engine priority: "
            "`priority` on SGLang (and `priority-hints`) replays them"
        )
    elif source.policy == "priority" and engine == "sglang":
        notes.append("no call carried an engine priority: `priority` replays every call at 0")
    return notes


@dataclass(frozen=True)
class Outcome:
    summaries: list[Summary]  # policy-major, capacities in the plan's order
    fidelity: Fidelity | None  # engine's own policy at the run's capacity (run directories)
    notes: list[str] = field(default_factory=list)  # how the cells were computed


def run_plan(
    source: Source,
    plan: Plan,
    ms_per_token: float | None = None,
    on_done: Callable[[str, int], None] = lambda _p, _c: None,
    jobs: int = 1,
) -> Outcome:
    """Every policy at every capacity (on_done after each), plus the fidelity replay. `jobs` > 1:
    the cells run on that many forked processes (sim.grid.run_cells: the same results in the
    same order, the same errors); 1: one after another, in this process."""
    trace = source.trace
    swept, notes = lru_in_one_pass(source, plan, ms_per_token)
    for cap in swept:
        on_done("lru", cap)
    every = [(p, c) for p in plan.policies for c in plan.capacities]
    cells = [(p, c) for p, c in every if not (p == "lru" and c in swept)]
    bs = trace.block_size
    blocks = [(p, c // bs) for p, c in every]
    # before the cells fork: done once (compiled or not as the whole grid decides)
    compiled = prepare(trace, blocks, plan.engine, run=[(p, c // bs) for p, c in cells])
    cell = partial(run_cell, source, plan, ms_per_token, compiled=compiled)
    by_cell = dict(zip(cells, run_cells(cell, cells, jobs, on_done), strict=True))
    by_cell.update({("lru", cap): (summary, None) for cap, summary in swept.items()})
    in_order = [by_cell[c] for c in every]
    summaries = [summary for summary, _ in in_order]
    found = None
    for _, cell_fidelity in in_order:  # the last matching cell's, as the sequential loop kept
        found = cell_fidelity if cell_fidelity is not None else found
    own = source.policy if source.kind == "run" else None
    run_cap = trace.capacity_tokens
    if found is None and own in POLICIES and run_cap is not None and source.kind == "run":
        kwargs = {"engine": plan.engine} if plan.engine else {}
        result = simulate(trace, own, run_cap // trace.block_size, **kwargs)
        found = fidelity(source, result)
    return Outcome(summaries, found, notes)


def lru_in_one_pass(
    source: Source, plan: Plan, ms_per_token: float | None
) -> tuple[dict[int, Summary], list[str]]:
    """LRU's capacities that one compiled pass over stack distances answers exactly
    (simulate.sweep_lru): {capacity tokens: summary}, and notes saying which were and why the
    others were simulated. Tried on vLLM's semantics without a host tier, and only where the
    compiled paths pay (compiled.worth_compiling: the trace's keys times LRU's capacities)."""
    trace = source.trace
    if "lru" not in plan.policies or plan.engine not in (None, "vllm") or plan.host_blocks:
        return {}, []
    if not worth_compiling(len(trace.keys) * len(plan.capacities)):
        return {}, []
    bs = trace.block_size
    results, why = sweep_lru(
        trace,
        [cap // bs for cap in plan.capacities],
        cache_outputs=plan.cache_outputs,
        in_request=plan.in_request,
    )
    swept = {
        cap: replace(
            summarize(trace, results[cap // bs], ms_per_token, plan.load_ms_per_block),
            requested_capacity_tokens=cap,
        )
        for cap in plan.capacities
        if cap // bs in results
    }
    notes = []
    if swept:
        n = len(swept)
        notes.append(
            f"lru at {n} capacit{'y' if n == 1 else 'ies'} ({', '.join(f'{c:,}' for c in swept)}"
            " tokens): one pass over LRU stack distances (equal to simulating each)"
        )
    reasons = sorted({why[cap // bs] for cap in plan.capacities if cap // bs in why})
    if reasons:
        left = [cap for cap in plan.capacities if cap // bs in why]
        notes.append(
            f"lru simulated capacity by capacity at {', '.join(f'{c:,}' for c in left)} "
            f"tokens: {'; '.join(reasons)}"
        )
    return swept, notes


def run_cell(
    source: Source,
    plan: Plan,
    ms_per_token: float | None,
    policy: str,
    cap: int,
    compiled: bool | None = None,
) -> tuple[Summary, Fidelity | None]:
    """`policy` at `cap` tokens under `plan`'s semantics: its summary, and the fidelity replay
    when this cell is the engine's own replay (its policy at the run's capacity, no host tier,
    the engine's caching and order), else None."""
    trace = source.trace
    tier = {"host_blocks": plan.host_blocks, "prefetch": plan.prefetch} if plan.host_blocks else {}
    caching = {"cache_outputs": plan.cache_outputs, "in_request": plan.in_request}
    engine = plan.engine or ("sglang" if policy in HINT_POLICIES else None)
    semantics = {"engine": engine} if engine else {}
    blocks = cap // trace.block_size
    result = simulate(trace, policy, blocks, **semantics, **tier, **caching, compiled=compiled)
    summary = summarize(trace, result, ms_per_token, plan.load_ms_per_block)
    own = source.policy if source.kind == "run" else None
    run_cap = trace.capacity_tokens
    found = None
    if (
        not tier
        and plan.cache_outputs
        and plan.in_request == IN_REQUEST[0]
        and policy == own
        and run_cap is not None
        and blocks == run_cap // trace.block_size
    ):
        found = fidelity(source, result)
    return replace(summary, requested_capacity_tokens=cap), found
