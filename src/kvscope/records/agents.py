"""Agents as every table, figure and replay names and orders them: the run's agent order and a
call's handoff edge (previous agent -> agent). Standard library only: a replay of a JSONL trace
orders and labels its agents without loading pyarrow.
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Any

AgentOrder = Sequence[str | None]


def agent_order(rows: Iterable[dict[str, Any]]) -> list[str | None]:
    """The run's agents in order of first appearance: by the start_ns of each agent's first call
    (ties: the row that comes first), with None (calls outside any agent) last if present.

    The one agent order of every analysis and view (tables, SQL via turns.order_sql, plots,
    colours): it comes from what ran, so any graph's agents work; on a PEER run it is planner,
    executor, expresser, reviewer.
    """
    first: dict[str, tuple[int, int]] = {}
    has_none = False
    for i, r in enumerate(rows):
        agent = r.get("agent_id")
        if agent is None:
            has_none = True
        elif agent not in first or (r.get("start_ns") or 0, i) < first[agent]:
            first[agent] = (r.get("start_ns") or 0, i)
    order: list[str | None] = sorted(first, key=first.__getitem__)
    return [*order, None] if has_none else order


def agent_key(order: AgentOrder = ()) -> Callable[[str | None], tuple[int, int, str]]:
    """Sort key over agents: those in `order` by their position, then any other agent by name,
    then None (calls no agent was named for). The same rule as turns.order_sql."""
    index = {a: i for i, a in enumerate(order) if a is not None}

    def key(agent: str | None) -> tuple[int, int, str]:
        if agent is None:
            return (2, 0, "")
        return (0, index[agent], "") if agent in index else (1, 0, agent)

    return key


def transition_label(previous_agent_id: str | None, agent_id: str) -> str:
    """A call's handoff edge as it is shown: "previous agent -> agent", "start -> agent" first."""
    return f"{previous_agent_id or 'start'} -> {agent_id}"
