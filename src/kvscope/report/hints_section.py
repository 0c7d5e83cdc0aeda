"""Across runs that differ in eviction policy or eviction hints (issue 29's A/B): per run and
per agent, what each arm measured live beside what the replay predicted.

Runs are grouped into arms of one comparison by everything but the policy and the hints (the
workload, the capacity, the engine and model). Per run:
- live: the recompute burden (prompt tokens computed instead of reused), the tokens recomputed
  because an eviction took a block a later call needed (harmful), TTFT p50 per agent, and how
  often the hints' next-agent predictor named the agent that came (records.priorities);
- replayed: the run's own replay (RUN/replay.json: its engine's policy at its capacity, with
  the priorities its calls carried): the simulator reproducing what the engine did;
- predicted: the replay of the arm's baseline (LRU without hints, else the first run without
  hints) under this run's policy and hints, i.e. the number known before this run was made.
  A run or baseline without replay.json shows null (`kvscope replay RUN`, or a sweep's
  `replay: true`, writes it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kvscope.analysis.run import RunAnalysis
from kvscope.records.priorities import next_agent_accuracy
from kvscope.records.run_dir import REPLAY_JSON
from kvscope.report.table import NULL, Section, Table, fmt
from kvscope.sim.hints import HINT_POLICIES

# a run's eviction hints -> the replay policy that computes them offline (sim/hints.py)
HINT_REPLAY = {level: name for name, level in HINT_POLICIES.items() if level is not None}
_ARM_KEYS = ("eviction_policy", "eviction_policy_config")  # engine settings an arm may differ in


def policy_of(d: RunAnalysis) -> str | None:
    return (d.config.get("engine") or {}).get("eviction_policy")


def hints_of(d: RunAnalysis) -> str:
    return d.config.get("eviction_hints") or "none"


def replay_policy(d: RunAnalysis) -> str | None:
    """The replay policy that stands for this run's arm (its hints, else its engine policy)."""
    return HINT_REPLAY.get(hints_of(d)) or policy_of(d)


def _setup(d: RunAnalysis) -> str:
    engine = {k: v for k, v in (d.config.get("engine") or {}).items() if k not in _ARM_KEYS}
    keep = {"engine": engine, "workload": d.config.get("workload"), "app": d.config.get("app"),
            "capacity": d.kv_capacity}  # fmt: skip
    return json.dumps(keep, sort_keys=True, default=str)


def baselines(data: Sequence[RunAnalysis]) -> list[RunAnalysis | None]:
    """Per run, its arm's baseline: the LRU run without hints of the same setup, else the first
    run without hints; None when the setup has none."""
    out = []
    for d in data:
        same = [o for o in data if _setup(o) == _setup(d) and hints_of(o) == "none"]
        lru = [o for o in same if policy_of(o) == "lru"]
        out.append((lru or same or [None])[0])
    return out


def _replay(d: RunAnalysis | None) -> dict[str, Any] | None:
    path = None if d is None else d.run_dir / REPLAY_JSON
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _result(doc: dict[str, Any] | None, policy: str | None) -> Any:
    """The replay's result for `policy` at the replayed run's capacity, or None."""
    for r in (doc or {}).get("results", []):
        if r["policy"] == policy and r["capacity_tokens"] == doc["run_capacity_tokens"]:
            return r
    return None


def _recompute(result: dict[str, Any] | None, agent: str | None = None) -> int | None:
    if result is None:
        return None
    if agent is None:
        return int(result["recompute_tokens"])
    got = result["per_agent"].get(agent)
    return None if got is None else got["prompt_tokens"] - got["cached_tokens"]


def _harm(d: RunAnalysis, agent: str | None = None) -> int | None:
    """Tokens recomputed after a harmful eviction (of `agent`'s blocks); None without KV events."""
    if d.evictions is None:
        return None
    rows = [r for r in d.evictions.to_pylist() if agent is None or r["victim_agent_id"] == agent]
    values = [r["recomputed_tokens"] for r in rows if r["harmful"]]
    return None if None in values else sum(values)


def _accuracy(d: RunAnalysis) -> float | None:
    """The hints' next-agent predictor over the run's calls (records.priorities)."""
    rows = sorted(d.requests.to_pylist(), key=lambda r: r.get("start_ns") or 0)
    return next_agent_accuracy((r["agent_id"], r.get("previous_agent_id")) for r in rows)


def _error(predicted: int | None, live: int | None) -> str:
    if predicted is None or live is None:
        return NULL
    return f"{(predicted - live) / live:+.1%}" if live else ("0" if predicted == 0 else NULL)


def _run_table(data: Sequence[RunAnalysis], base: list[RunAnalysis | None]) -> Table:
    rows = []
    for d, b in zip(data, base, strict=True):
        live = d.total.new_prefill_tokens
        replayed = _recompute(_result(_replay(d), policy_of(d)))
        predicted = _recompute(_result(_replay(b), replay_policy(d)))
        rows.append([
            d.label, fmt(d.kv_capacity, "int"), policy_of(d) or NULL, hints_of(d),
            fmt(live, "int"), fmt(replayed, "int"), _error(replayed, live),
            NULL if b is None else b.label, fmt(predicted, "int"), _error(predicted, live),
            fmt(_harm(d), "int"), fmt(_accuracy(d), "ratio"),
        ])  # fmt: skip
    heads = ["run", "KV capacity", "policy", "hints", "recompute burden", "replayed",
             "replay error", "baseline", "predicted", "prediction error",
             "harmful-eviction tokens", "next-agent predicted"]  # fmt: skip
    note = (
        "replayed: the run's own replay (its policy and priorities); predicted: the "
        "baseline's replay under this run's policy and hints, before this run was made"
    )
    text = [True, False, True, True, False, False, False, True, False, False, False, False]
    return Table("per run", heads, rows, note, text)


def _agent_table(data: Sequence[RunAnalysis], base: list[RunAnalysis | None]) -> Table:
    rows = []
    for d, b in zip(data, base, strict=True):
        own = _result(_replay(d), policy_of(d))
        predicted = _result(_replay(b), replay_policy(d))
        for a in d.agents:
            rows.append([
                d.label, a.agent_id, fmt(a.new_prefill_tokens, "int"),
                fmt(_recompute(own, a.agent_id), "int"),
                fmt(_recompute(predicted, a.agent_id), "int"),
                fmt(_harm(d, a.agent_id), "int"), fmt(a.ttft_p50_ms, "ms"),
            ])  # fmt: skip
    heads = ["run", "agent", "recompute burden", "replayed", "predicted",
             "harmful-eviction tokens (victim)", "TTFT p50 ms"]  # fmt: skip
    return Table("per run and agent", heads, rows, "", [True, True] + [False] * 5)


def hints_section(data: Sequence[RunAnalysis]) -> Section | None:
    """The A/B section; None unless the runs differ in eviction policy or hints."""
    arms = {(policy_of(d), hints_of(d)) for d in data}
    if len(data) < 2 or len(arms) < 2:
        return None
    base = baselines(data)
    notes = []
    if missing := [d.label for d in data if _replay(d) is None]:
        notes.append(f"no replay.json (kvscope replay RUN, or a sweep's replay: true): "
                     f"{', '.join(missing)}")  # fmt: skip
    return Section(
        "eviction-hints",
        "Eviction policy and hints: live beside the replay's prediction",
        "Each arm (policy, hints) measured live, with the replay of the run itself and the "
        "replay of its baseline under the arm's policy (the prediction made before the run).",
        tables=[_run_table(data, base), _agent_table(data, base)],
        notes=notes,
    )
