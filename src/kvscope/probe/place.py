"""Where a call sits in an agent framework's own run: the identity columns a framework reader
gives (probe/openai_agents.py, probe/crewai.py, probe/autogen.py), which probe/identity.py turns
into the call's CallIdentity when LangGraph does not name the call.

Standard library only: a framework reader runs in the app's interpreter, also where kvscope is
not installed (probe/lite.py).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class FrameworkPlace:
    """One call's identity columns, as the framework's runtime names them (None: not known)."""

    agent_id: str
    graph_node: str | None
    workflow_run_id: str
    thread_id: str | None
    turn_id: int
    previous_agent_id: str | None
    tool_ms: float | None
