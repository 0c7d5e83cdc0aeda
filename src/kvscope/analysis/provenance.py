"""Level 3 per agent: where each agent's prompt tokens came from (finalize fills the columns)."""

from collections.abc import Sequence
from typing import Any

from kvscope.records.requests import PROVENANCE_COLUMNS

Row = dict[str, Any]


def by_agent(rows: Sequence[Row]) -> dict[str, dict[str, int]]:
    """Provenance columns summed per agent over the rows that have them."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        if r.get("cached_self_tokens") is None:
            continue
        sums = out.setdefault(r["agent_id"], dict.fromkeys(PROVENANCE_COLUMNS, 0))
        for c in PROVENANCE_COLUMNS:
            sums[c] += r[c]
    return out
