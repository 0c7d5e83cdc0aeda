"""Across runs of the same calls (a run and its live replay): per agent and turn, and per
transition, what the other configuration changed: cached tokens, hit ratio, recompute and TTFT.

Rows are keyed by (agent, turn) and by transition (previous agent -> agent), over successful
calls; a run without the key shows null. The last column is the TTFT difference of the last run
against the first (a replay against its original). Nothing here is shown for a single run.
"""

from collections.abc import Sequence
from typing import Any

from kvscope.analysis.run import RunAnalysis
from kvscope.records.agents import transition_label
from kvscope.records.requests import STATUS_OK
from kvscope.report.table import NULL, Section, Table, fmt


def _grouped(data: RunAnalysis, key: Any) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    rows = sorted(data.requests.to_pylist(), key=lambda r: r.get("start_ns") or 0)
    for r in rows:
        if r.get("status") != STATUS_OK or r.get("agent_id") is None:
            continue
        g = out.setdefault(key(r), {"prompt": 0, "cached": 0, "known": True, "ttft": []})
        g["prompt"] += r.get("prompt_tokens") or 0
        if r.get("cached_tokens") is None:
            g["known"] = False
        else:
            g["cached"] += r["cached_tokens"]
        if r.get("ttft_ms") is not None:
            g["ttft"].append(r["ttft_ms"])
    return out


def _ttft(g: dict[str, Any] | None) -> float | None:
    return sum(g["ttft"]) / len(g["ttft"]) if g and g["ttft"] else None


def _ratio(g: dict[str, Any] | None) -> float | None:
    return g["cached"] / g["prompt"] if g and g["known"] and g["prompt"] else None


def _recompute(g: dict[str, Any] | None) -> int | None:
    return g["prompt"] - g["cached"] if g and g["known"] else None


def _keys(groups: Sequence[dict[Any, Any]]) -> list[Any]:
    return list(dict.fromkeys(k for g in groups for k in g))


def turn_table(data: Sequence[RunAnalysis]) -> Table:
    groups = [_grouped(d, lambda r: (r["agent_id"], r.get("turn_id"))) for d in data]
    labels = [d.label for d in data]
    headers = ["agent", "turn"]
    for label in labels:
        headers += [f"cached {label}", f"TTFT ms {label}"]
    headers.append(f"ΔTTFT ms ({labels[-1]} - {labels[0]})")
    rows = []
    for agent, turn in _keys(groups):
        row = [agent, NULL if turn is None else str(turn)]
        for g in groups:
            got = g.get((agent, turn))
            row += [fmt(got["cached"] if got and got["known"] else None, "int"),
                    fmt(_ttft(got), "ms")]  # fmt: skip
        first, last = _ttft(groups[0].get((agent, turn))), _ttft(groups[-1].get((agent, turn)))
        row.append(fmt(None if first is None or last is None else last - first, "ms"))
        rows.append(row)
    return Table("per agent and turn (mean TTFT)", headers, rows, text=[True, True])


def transition_table(data: Sequence[RunAnalysis]) -> Table:
    groups = [
        _grouped(d, lambda r: transition_label(r.get("previous_agent_id"), r["agent_id"]))
        for d in data
    ]
    headers = ["transition"]
    for d in data:
        headers += [f"hit ratio {d.label}", f"recompute {d.label}"]
    rows = []
    for key in _keys(groups):
        row = [key]
        for g in groups:
            row += [fmt(_ratio(g.get(key)), "ratio"), fmt(_recompute(g.get(key)), "int")]
        rows.append(row)
    return Table("per transition", headers, rows, text=[True])


def turns_section(data: Sequence[RunAnalysis]) -> Section | None:
    """The section, for two runs or more (None for one)."""
    if len(data) < 2:
        return None
    replays = [d.label for d in data if d.run.get("replay_of")]
    intro = (
        "The same agents, turns and transitions in each run: what the other configuration "
        "changed. Cached tokens and recompute are the engine's; TTFT the client's."
    )
    if replays:
        intro += f" Live replays: {', '.join(replays)}."
    return Section(
        "turns", "Per agent, turn and transition", intro,
        tables=[turn_table(data), transition_table(data)],
    )  # fmt: skip
