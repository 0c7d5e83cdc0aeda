"""What a live replay measured beside what its source measured and what the simulator predicted.

`live_document(...)` is RUN/live_replay.json of a replay run: the settings, the calls sent and
how many failed, whether the agents came in the recorded order, and per agent (in the order of
first appearance) prompt and cached tokens: `original` (the source's engine; a trace: null),
`replay` (this run's engine) and `predicted` (the offline simulator, the source engine's own
policy, at the replay engine's capacity, over exactly the replayed calls; null where there are
no token ids). A value not measured is null.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from kvscope.live.calls import LiveCall
from kvscope.records.requests import STATUS_OK
from kvscope.sim.inputs.sources import Source
from kvscope.sim.results.summary import NO_AGENT
from kvscope.sim.trace import Trace


def subset(trace: Trace, picked: list[int]) -> Trace:
    """The trace's requests `picked` (in that order), keys re-packed."""
    blocks = [trace.blocks_of(i) for i in picked]
    offsets = np.zeros(len(picked) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blocks], out=offsets[1:])
    measured = trace.measured_cached_tokens
    return replace(
        trace,
        request_ids=tuple(trace.request_ids[i] for i in picked),
        start_s=trace.start_s[picked],
        end_s=trace.end_s[picked],
        prompt_tokens=trace.prompt_tokens[picked],
        output_tokens=trace.output_tokens[picked],
        keys=np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.uint64),
        offsets=offsets,
        agents=tuple(trace.agents[i] for i in picked),
        workflows=tuple(trace.workflows[i] for i in picked),
        previous_agents=tuple(trace.previous_agents[i] for i in picked),
        measured_cached_tokens=None if measured is None else measured[picked],
        priorities=None if trace.priorities is None else trace.priorities[picked],
        prefill_end_s=None if trace.prefill_end_s is None else trace.prefill_end_s[picked],
    )


def predicted(source: Source, calls: list[LiveCall], capacity: int | None) -> dict[str, Any]:
    """The simulator's per-agent prediction for the replayed calls at `capacity` (tokens)."""
    if capacity is None:
        return {"capacity_tokens": None, "note": "the replay engine's capacity is not known"}
    from kvscope.sim.plan import make_plan, run_plan

    index = {rid: i for i, rid in enumerate(source.trace.request_ids)}
    trace = subset(source.trace, [index[c.request_id] for c in calls])
    picked = replace(source, trace=trace, excluded={}, excluded_start_s=None, id_mismatch=None)
    own = source.policy or "lru"
    plan = make_plan(picked, [own], [str(capacity)])
    summary = run_plan(replace(picked, kind="tokens"), plan).summaries[0]
    return {
        "policy": own,
        "capacity_tokens": capacity,
        "hit_ratio": summary.hit_ratio,
        "evictions": summary.evictions,
        "harmful_evictions": sum(int(h["blocks"]) for h in summary.harm),
        "per_agent": summary.per_agent,
    }


def original(calls: list[LiveCall]) -> dict[str, dict[str, int | None]]:
    """Per agent, the source's prompt and measured cached tokens over the replayed calls."""
    out: dict[str, dict[str, int | None]] = {}
    for c in calls:
        row = out.setdefault(c.agent or NO_AGENT, {"prompt_tokens": 0, "cached_tokens": 0})
        if row["prompt_tokens"] is not None:
            n = c.prompt_tokens
            row["prompt_tokens"] = None if n is None else row["prompt_tokens"] + n
        if c.recorded_cached is None or row["cached_tokens"] is None:
            row["cached_tokens"] = None
        else:
            row["cached_tokens"] += int(c.recorded_cached)
    return out


def measured(
    table: pa.Table,
) -> tuple[dict[str, dict[str, int | None]], list[tuple[str | None, str]]]:
    """Per agent, the replay run's prompt and cached tokens (ok calls), and (workflow, agent)
    of every call in the order the calls started."""
    rows = sorted(table.to_pylist(), key=lambda r: r.get("start_ns") or 0)
    out: dict[str, dict[str, int | None]] = {}
    for r in rows:
        row = out.setdefault(r["agent_id"] or NO_AGENT, {"prompt_tokens": 0, "cached_tokens": 0})
        if r.get("status") != STATUS_OK:
            continue
        row["prompt_tokens"] = int(row["prompt_tokens"] or 0) + int(r["prompt_tokens"] or 0)
        if r.get("cached_tokens") is None or row["cached_tokens"] is None:
            row["cached_tokens"] = None
        else:
            row["cached_tokens"] += int(r["cached_tokens"])
    return out, [(r.get("workflow_run_id"), r["agent_id"] or NO_AGENT) for r in rows]


def live_document(
    calls: list[LiveCall],
    settings: dict[str, Any],
    table: pa.Table,
    prediction: dict[str, Any],
    harmful_evictions: float | None,
) -> dict[str, Any]:
    replay, started = measured(table)
    before = original(calls)
    first = sorted(calls, key=lambda c: c.start_s)
    agents = list(dict.fromkeys([*(c.agent or NO_AGENT for c in first), *replay]))
    recorded = [(c.workflow, c.agent or NO_AGENT) for c in sorted(calls, key=lambda c: c.start_s)]
    return {
        "settings": settings,
        "calls": len(calls),
        "failed": sum(r.get("status") != STATUS_OK for r in table.to_pylist()),
        "agent_order_same": _first_seen(started) == _first_seen(recorded),
        "workflow_sequences_same": _sequences(started) == _sequences(recorded),
        "interleaving_same": started == recorded,
        "harmful_evictions": harmful_evictions,
        "predicted": prediction,
        "per_agent": {
            a: {
                "original": before.get(a)
                if any(c.recorded_cached is not None for c in calls)
                else None,
                "replay": replay.get(a),
                "predicted": (prediction.get("per_agent") or {}).get(a),
            }
            for a in agents
        },
    }


def _first_seen(calls: list[tuple[str | None, str]]) -> list[str]:
    return list(dict.fromkeys(agent for _, agent in calls))


def _sequences(calls: list[tuple[str | None, str]]) -> dict[str | None, list[str]]:
    """Each workflow's agents in the order its calls started."""
    out: dict[str | None, list[str]] = {}
    for workflow, agent in calls:
        out.setdefault(workflow, []).append(agent)
    return out


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """The terminal's lines: per agent cached tokens, original / replay / predicted."""

    def cached(v: dict[str, Any] | None) -> str:
        if v is None or v.get("cached_tokens") is None:
            return "-"
        prompt = v.get("prompt_tokens")
        return f"{v['cached_tokens']:,}/{'-' if prompt is None else format(prompt, ',')}"

    pred = doc["predicted"]
    said = (
        f"predicted {pred['harmful_evictions']} ({pred['policy']} @ {pred['capacity_tokens']:,}"
        " tokens)"
        if pred.get("per_agent") is not None
        else "no prediction"
    )
    lines = [
        f"live replay: {doc['calls']} calls, {doc['failed']} failed; agent order "
        f"{_same(doc['agent_order_same'])}, each workflow's agents "
        f"{_same(doc['workflow_sequences_same'])}, interleaving {_same(doc['interleaving_same'])}; "
        f"harmful evictions measured {doc['harmful_evictions']}, {said}",
        "cached/prompt tokens per agent: original | replay | predicted",
    ]
    for agent, v in doc["per_agent"].items():
        lines.append(
            f"  {agent}: {cached(v['original'])} | {cached(v['replay'])} | {cached(v['predicted'])}"
        )
    return lines


def _same(flag: bool) -> str:
    return "as recorded" if flag else "differs"
