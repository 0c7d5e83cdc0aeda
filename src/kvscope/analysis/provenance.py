"""Level 3 per agent: where each agent's prompt tokens came from (finalize fills the columns)."""

from collections.abc import Sequence

from kvscope.records.base import Row
from kvscope.records.requests import PROVENANCE_COLUMNS, STATUS_OK


def by_agent(rows: Sequence[Row]) -> dict[str, dict[str, int]]:
    """Provenance columns summed per agent over its successful rows that have them, with their
    coverage: `provenance_calls` (the rows summed) of `calls` (the agent's successful rows)."""
    out: dict[str, dict[str, int]] = {}
    calls: dict[str, int] = {}
    for r in rows:
        if r.get("status") != STATUS_OK:
            continue
        calls[r["agent_id"]] = calls.get(r["agent_id"], 0) + 1
        if r.get("cached_self_tokens") is None:
            continue
        sums = out.setdefault(
            r["agent_id"], {"provenance_calls": 0, **dict.fromkeys(PROVENANCE_COLUMNS, 0)}
        )
        sums["provenance_calls"] += 1
        for c in PROVENANCE_COLUMNS:
            sums[c] += r[c]
    return {a: {"calls": calls[a], **sums} for a, sums in out.items()}
