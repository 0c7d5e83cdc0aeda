"""One replay's outcome in numbers: hit ratios overall, per agent and per transition, recompute,
harmful evictions by agent pair, and the TTFT the policy would save.

`summarize(trace, result, ms_per_token)` -> `Summary`; `Summary.to_dict()` is the JSON record
(`--json`, replay.json): {policy, capacity_tokens (the whole blocks replayed), requests,
prompt_tokens, cached_tokens, hit_ratio, per_agent: {agent: {prompt_tokens, cached_tokens}},
seconds, ...} plus capacity_blocks, requested_capacity_tokens (as asked, before rounding to
whole blocks), caching ("cache-outputs" or "prompt-only": what the cache held, simulate's
CACHING), in_request_order ("tail-first" or "head-first": which of a request's blocks is
evicted first, simulate's IN_REQUEST), recompute_tokens,
preempted, evictions, per_transition (same shape as per_agent), harm ([{evictor_agent,
victim_agent, blocks, tokens}]: prompt tokens recomputed because the evictor agent's allocation
evicted what the victim agent had stored) and
ttft_saved_ms; with a host tier also `tiers` (tiered.py: device / host / prefetched / missed
tokens per agent, the load time). Recompute tokens are those neither hit nor loaded; host hits
count in TTFT saved as prefill saved less their load time (null when no load cost was given).

Hit ratio (the device's) is token-weighted: sum(cached) / sum(prompt). `ttft_saved_ms` =
ms_per_token * sum(simulated - measured cached tokens) over the requests whose cached tokens the
engine measured: positive when the policy would have saved prefill time against the run; null
when no prefill cost was fitted or nothing was measured. A value not measured is null, never 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvscope.records.agents import agent_order
from kvscope.sim.caches.result import SimResult
from kvscope.sim.results.tier_numbers import tier_numbers
from kvscope.sim.trace import Trace

NO_AGENT = "(no agent)"  # calls no agent was named for (the report's label too)
UNKNOWN = "unknown"  # an evictor or owner the simulator could not name


@dataclass(frozen=True)
class Summary:
    policy: str
    capacity_tokens: int
    capacity_blocks: int
    requests: int
    prompt_tokens: int
    cached_tokens: int
    hit_ratio: float | None
    recompute_tokens: int
    preempted: int
    evictions: int
    per_agent: dict[str, dict[str, int]]
    per_transition: dict[str, dict[str, int]]
    harm: list[dict[str, Any]] | None  # None: not attributed (SimResult.attributed)
    ttft_saved_ms: float | None
    seconds: float
    tiers: dict[str, Any] | None = None  # tiered.tier_numbers, with a host tier only
    # the capacity asked for, in tokens (capacity_tokens: the whole blocks it holds); None: not
    # known (a summary made outside a replay plan)
    requested_capacity_tokens: int | None = None
    caching: str = "cache-outputs"  # what the cache held: SimResult.caching
    in_request: str = "tail-first"  # which of a request's blocks is evicted first: SimResult's

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "capacity_tokens": self.capacity_tokens,
            "capacity_blocks": self.capacity_blocks,
            "requested_capacity_tokens": self.requested_capacity_tokens,
            "caching": self.caching,
            "in_request_order": self.in_request,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_ratio": self.hit_ratio,
            "recompute_tokens": self.recompute_tokens,
            "preempted": self.preempted,
            "evictions": self.evictions,
            "per_agent": self.per_agent,
            "per_transition": self.per_transition,
            "harm": self.harm,
            "ttft_saved_ms": self.ttft_saved_ms,
            "seconds": self.seconds,
            **({"tiers": self.tiers} if self.tiers is not None else {}),
        }


def agent_label(agent: str | None) -> str:
    return NO_AGENT if agent is None else agent


def ordered_agents(trace: Trace) -> list[str]:
    """The trace's agents in order of first appearance (records.agents.agent_order), as labels."""
    rows = (
        {"agent_id": a, "start_ns": s} for a, s in zip(trace.agents, trace.start_s, strict=True)
    )
    return [agent_label(a) for a in agent_order(rows)]


@dataclass(frozen=True)
class Labels:
    """A trace's per-request labels, as codes into their names: what every summary of the trace
    groups by (made once per trace: `labels`)."""

    agents: list[str]  # per request
    agent_names: list[str]  # ordered_agents' order
    agent_codes: np.ndarray  # int64 per request, into agent_names
    transition_names: list[str]  # by first use
    transition_codes: np.ndarray


_last: list[tuple[Trace, Labels]] = []  # the last trace's labels (a sweep summarizes it often)


def labels(trace: Trace) -> Labels:
    if _last and _last[0][0] is trace:
        return _last[0][1]
    agents = [agent_label(a) for a in trace.agents]
    names = ordered_agents(trace)
    transitions = [t or NO_AGENT for t in (trace.transition(i) for i in range(len(trace)))]
    tnames = list(dict.fromkeys(transitions))
    made = Labels(agents, names, _codes(agents, names), tnames, _codes(transitions, tnames))
    _last[:] = [(trace, made)]
    return made


def _codes(values: list[str], names: list[str]) -> np.ndarray:
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[v] for v in values], dtype=np.int64)


def _grouped(names: list[str], codes: np.ndarray, prompt: np.ndarray, cached: np.ndarray) -> dict:
    """{name: {prompt_tokens, cached_tokens}} in the names' order."""
    p = np.bincount(codes, weights=prompt, minlength=len(names))
    c = np.bincount(codes, weights=cached, minlength=len(names))
    return {
        name: {"prompt_tokens": int(p[i]), "cached_tokens": int(c[i])}
        for i, name in enumerate(names)
    }


def summarize(
    trace: Trace,
    result: SimResult,
    ms_per_token: float | None = None,
    load_ms_per_block: float | None = None,
) -> Summary:
    """The numbers of one replay (see the module doc)."""
    prompt = trace.prompt_tokens.astype(np.int64)
    cached = np.minimum(result.cached_tokens.astype(np.int64), prompt)
    loaded = np.minimum(result.host_blocks * result.block_size, prompt - cached)
    lab = labels(trace)
    total = int(prompt.sum())
    tiers = tier_numbers(trace, result, lab.agents, load_ms_per_block)
    saved = ttft_saved_ms(trace, cached + loaded, ms_per_token)
    if tiers is not None and saved is not None and tiers["host_tokens"]:
        saved = None if tiers["load_ms"] is None else saved - tiers["load_ms"]
    return Summary(
        policy=result.policy,
        capacity_tokens=result.capacity_blocks * result.block_size,
        capacity_blocks=result.capacity_blocks,
        requests=len(trace),
        prompt_tokens=total,
        cached_tokens=int(cached.sum()),
        hit_ratio=float(cached.sum()) / total if total else None,
        recompute_tokens=int((prompt - cached - loaded).sum()),
        preempted=int(result.preempted.sum()),
        evictions=int(result.evictions),
        per_agent=_grouped(lab.agent_names, lab.agent_codes, prompt, cached),
        per_transition=_grouped(lab.transition_names, lab.transition_codes, prompt, cached),
        harm=harm_pairs(trace, result) if result.attributed and names_anyone(trace) else None,
        ttft_saved_ms=saved,
        seconds=float(result.seconds),
        tiers=tiers,
        caching=result.caching,
        in_request=result.in_request,
    )


UNNAMED_HARM = "harmful evictions not attributed (null): no request names an agent or a workflow"


def names_anyone(trace: Trace) -> bool:
    """Whether a request names an agent or a workflow: else harm has no one to attribute to (a
    summary's `harm` is null, UNNAMED_HARM says why), whether the trace was read whole or
    streamed."""
    return any(a is not None for a in trace.agents) or any(w is not None for w in trace.workflows)


def harm_pairs(trace: Trace, result: SimResult) -> list[dict[str, Any]]:
    """Recomputed blocks summed per (evictor agent -> victim agent), most tokens first.

    The victim is the agent whose request had stored the evicted blocks (analysis.evictions'
    rule); an evictor or owner the simulator reports as -1 is UNKNOWN.
    """
    lab = labels(trace)
    names = [*lab.agent_names, UNKNOWN]
    code = np.append(lab.agent_codes, len(names) - 1)  # code[-1]: UNKNOWN
    k = len(names)
    pairs = code[result.harm_evictor] * k + code[result.harm_owner]
    found, where = np.unique(pairs, return_inverse=True)
    sums = np.bincount(where, weights=result.harm_blocks, minlength=len(found)).astype(np.int64)
    rows = [
        {"evictor_agent": names[p // k], "victim_agent": names[p % k], "blocks": int(b),
         "tokens": int(b) * result.block_size}
        for p, b in zip(found.tolist(), sums.tolist(), strict=True)
    ]  # fmt: skip
    return sorted(rows, key=lambda r: (-r["tokens"], r["evictor_agent"], r["victim_agent"]))


def ttft_saved_ms(trace: Trace, cached: np.ndarray, ms_per_token: float | None) -> float | None:
    """ms_per_token * sum(simulated - measured cached) where measured; None when not computable."""
    measured = trace.measured_cached_tokens
    if ms_per_token is None or math.isnan(ms_per_token) or measured is None:
        return None
    known = ~np.isnan(measured)
    if not known.any():
        return None
    return float(ms_per_token * (cached[known] - measured[known]).sum())
