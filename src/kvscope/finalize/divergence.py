"""Where prompts first diverge (design note, Phase 7): the application-side bound on reuse.

For each call: the first token index where its prompt differs from this agent's previous call
in the same workflow, and from the workflow's previous call (the previous agent's); and the
longest common prefix with any call of the run that started earlier: the most prefix cache
reuse the prompt layout allows, whatever the cache does.
"""

from array import array
from collections.abc import Mapping, Sequence

import numpy as np

from kvscope.finalize.lcp import Pieces
from kvscope.finalize.prompts import Prompts, as_prompts
from kvscope.records.base import Row

COLUMNS = ("first_divergence_same_agent", "first_divergence_previous_agent", "max_reusable_tokens")


def with_divergence(
    rows: Sequence[Row], tokens: Prompts | Mapping[str, Sequence[int] | np.ndarray]
) -> list[Row]:
    """The rows with the three columns filled where the request's prompt tokens are known:
    set in place (finalize's rows are its own; a copy of a 100k-call run's rows is ~150 MiB),
    the same rows returned as a list. The common prefixes of all the pairs are found at once
    (finalize.lcp.Pieces.common), not prompt pair by prompt pair."""
    prompts = as_prompts(tokens)
    order = [
        r for r in sorted(rows, key=lambda r: r["start_ns"])
        if prompts.get(r["request_uuid"]) is not None
    ]  # fmt: skip
    pieces = Pieces.of(prompts.named(r["request_uuid"] for r in order))
    longest = pieces.longest_with_earlier()
    # the pairs (prompt, earlier prompt) per column, in flat arrays: a Python object per pair
    # left ~90 MiB of Python's small-object memory pinned after this pass at 100k calls
    pairs = (array("q"), array("q"), array("q"))  # index in order of: the call, earlier, column
    last_call: dict[str, int] = {}  # workflow -> its latest prompt (index in order)
    last_agent: dict[tuple[str, str], int] = {}  # (workflow, agent) -> its latest prompt
    for i, r in enumerate(order):
        wf, agent = r["workflow_run_id"], r["agent_id"]
        for column, earlier in enumerate((last_agent.get((wf, agent)), last_call.get(wf))):
            if earlier is not None:
                pairs[0].append(i)
                pairs[1].append(earlier)
                pairs[2].append(column)
        last_call[wf] = last_agent[(wf, agent)] = i
    del last_call, last_agent
    which, earlier, column = (np.frombuffer(a, dtype=np.int64) for a in pairs)
    table = np.full((3, len(order)), -1, dtype=np.int64)
    table[column, which] = pieces.common(which, earlier)
    table[2] = longest
    del pieces, which, earlier, column, pairs
    ints: dict[int | None, int | None] = {-1: None}  # one int object per distinct value
    for r, v in zip(order, zip(*(t.tolist() for t in table), strict=True), strict=True):
        r.update((k, ints.setdefault(x, x)) for k, x in zip(COLUMNS, v, strict=True))
    return list(rows)
