"""Eviction attribution tables over the block table (analysis.provenance's `blocks`).

The victim of an eviction is the agent whose request stored the block; the evictor is inferred
(see provenance). A harmful eviction is one whose block a later request needed and recomputed;
its cost, in recomputed tokens, is charged to (evictor agent -> victim agent).
"""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvscope.analysis.agents import AGENT_ORDER, percentile

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Cell:
    evictor_agent_id: str
    victim_agent_id: str
    scope: str  # "same workflow" | "cross workflow" | "unknown"
    evictions: int
    harmful: int
    recomputed_tokens: int


@dataclass(frozen=True)
class TransitionHarm:
    transition: str  # of the request that recomputed: previous agent -> agent
    harmful: int
    recomputed_tokens: int


@dataclass(frozen=True)
class Residency:
    agent_id: str  # owner
    blocks: int
    evicted: int
    residency_p50_ms: float | None  # over the blocks that were removed
    residency_p95_ms: float | None
    residency_max_ms: float | None


def _evicted(blocks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in blocks if b["removal"] == "evicted"]


def matrix(blocks: Sequence[dict[str, Any]]) -> list[Cell]:
    """Evictor agent x victim agent, split by whether both were in the same workflow."""
    cells: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for b in _evicted(blocks):
        evictor, victim = b["evictor_agent_id"] or UNKNOWN, b["owner_agent_id"] or UNKNOWN
        ew, vw = b["evictor_workflow_run_id"], b["owner_workflow_run_id"]
        scope = UNKNOWN if ew is None or vw is None else (
            "same workflow" if ew == vw else "cross workflow"
        )  # fmt: skip
        c = cells[(evictor, victim, scope)]
        c[0] += 1
        c[1] += bool(b["harmful"])
        c[2] += b["recomputed_tokens"] or 0
    return [
        Cell(e, v, s, *c)
        for (e, v, s), c in sorted(cells.items(), key=lambda kv: (rank(kv[0][0]), rank(kv[0][1])))
    ]


def by_transition(blocks: Sequence[dict[str, Any]]) -> list[TransitionHarm]:
    """Harmful evictions by the PEER transition of the request that paid for them."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for b in _evicted(blocks):
        if b["harmful"]:
            t = out[b["needed_by_transition"] or UNKNOWN]
            t[0] += 1
            t[1] += b["recomputed_tokens"] or 0
    return [TransitionHarm(k, *v) for k, v in sorted(out.items(), key=lambda kv: -kv[1][1])]


def residency(blocks: Sequence[dict[str, Any]]) -> list[Residency]:
    """How long each agent's blocks stayed in the cache before they were removed."""
    agents = sorted({b["owner_agent_id"] or UNKNOWN for b in blocks}, key=rank)
    out = []
    for a in agents:
        mine = [b for b in blocks if (b["owner_agent_id"] or UNKNOWN) == a]
        times = [b["residency_ms"] for b in mine if b["residency_ms"] is not None]
        out.append(Residency(
            a, len(mine), sum(b["removal"] == "evicted" for b in mine),
            percentile(times, 50), percentile(times, 95), max(times) if times else None,
        ))  # fmt: skip
    return out


def summary(blocks: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Run-level numbers for MLflow: eviction counts, harm, and the worst evictor -> victim pair."""
    ev = _evicted(blocks)
    out: dict[str, float] = {
        "blocks_stored": float(len(blocks)),
        "blocks_evicted": float(len(ev)),
        "harmful_evictions": float(sum(bool(b["harmful"]) for b in ev)),
        "recomputed_tokens": float(sum(b["recomputed_tokens"] or 0 for b in ev)),
        "evictions_unattributed_evictor": float(sum(b["evictor_agent_id"] is None for b in ev)),
    }
    for c in matrix(blocks):
        if c.harmful:
            key = f"harm.{c.evictor_agent_id}_to_{c.victim_agent_id}.recomputed_tokens"
            out[key] = out.get(key, 0.0) + c.recomputed_tokens
    return out


def rank(agent: str) -> tuple[int, str]:
    return (AGENT_ORDER.index(agent) if agent in AGENT_ORDER else len(AGENT_ORDER), agent)
