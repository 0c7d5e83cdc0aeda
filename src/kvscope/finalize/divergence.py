"""Where prompts first diverge (design note, Phase 7): the application-side bound on reuse.

For each call: the first token index where its prompt differs from this agent's previous call
in the same workflow, and from the workflow's previous call (the previous agent's); and the
longest common prefix with any call of the run that started earlier: the most prefix cache
reuse the prompt layout allows, whatever the cache does.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvscope.finalize import heaptrim
from kvscope.finalize.gcpause import without_gc
from kvscope.finalize.lcp import longest_with_earlier
from kvscope.records.tokens import common_prefix

Row = dict[str, Any]
COLUMNS = ("first_divergence_same_agent", "first_divergence_previous_agent", "max_reusable_tokens")


@without_gc
def with_divergence(
    rows: Sequence[Row], tokens: Mapping[str, Sequence[int] | np.ndarray]
) -> list[Row]:
    """The rows with the three columns filled where the request's prompt tokens are known:
    set in place (finalize's rows are its own; a copy of a 100k-call run's rows is ~150 MiB),
    the same rows returned as a list."""
    order = [
        r for r in sorted(rows, key=lambda r: r["start_ns"])
        if tokens.get(r["request_uuid"]) is not None
    ]  # fmt: skip
    prompts = [np.asarray(tokens[r["request_uuid"]]) for r in order]
    longest = longest_with_earlier(prompts)
    heaptrim.release()  # the prefix search's temporaries
    last_call: dict[str, np.ndarray] = {}  # workflow -> its latest prompt
    last_agent: dict[tuple[str, str], np.ndarray] = {}  # (workflow, agent) -> latest prompt
    ints: dict[int | None, int | None] = {}  # one int object per distinct value (in every row)
    for r, ids, reuse in zip(order, prompts, longest, strict=True):
        wf, agent = r["workflow_run_id"], r["agent_id"]
        same, prev = last_agent.get((wf, agent)), last_call.get(wf)
        values = (
            None if same is None else common_prefix(ids, same),
            None if prev is None else common_prefix(ids, prev),
            reuse,
        )
        r.update((k, ints.setdefault(v, v)) for k, v in zip(COLUMNS, values, strict=True))
        last_call[wf] = last_agent[(wf, agent)] = ids
    return list(rows)
