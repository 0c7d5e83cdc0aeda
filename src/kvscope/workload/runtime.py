"""What is left of the private agent runtime: the identifiers probe/tracing.py's live spans take.

The PEER workflow no longer calls kvscope (workload/peer.py is a plain LangGraph app, profiled by
interception); only the live-span Tracer still names its spans by a `CallIds`. This module goes
with that Tracer when traces are built from the streams at publish.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class CallIds:
    """The design note's identifier hierarchy for one agent call."""

    benchmark_run_id: str
    thread_id: str
    workflow_run_id: str
    turn_id: int  # the PEER cycle, from 1
    agent_id: str  # planner | executor | expresser | reviewer
    previous_agent_id: str | None  # None for the first call of a workflow
    graph_node: str
