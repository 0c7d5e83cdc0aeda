"""kvscope: per-agent prefix KV cache profiling for multi-agent LLM workflows.

import kvscope
with kvscope.profile(name="my-app"):      # the embedded engine; or engine=YAML, attach=URL
    graph.invoke(...)                     # every model call: a row, named by LangGraph
with kvscope.agent("planner"):            # name calls made outside LangGraph
    ...
with kvscope.annotate(layout="role-first", fixed_messages=1):   # what only the app knows
    ...
"""

from typing import TYPE_CHECKING, Any

from kvscope.probe.labels import agent, annotate

if TYPE_CHECKING:
    from kvscope.profiling import Profile, profile

__all__ = ["Profile", "agent", "annotate", "profile"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # profile() loads MLflow and the engines: only when asked for, so that `import kvscope`
    # (and the probe inside a profiled program) stays light.
    if name in ("profile", "Profile"):
        from kvscope import profiling

        return getattr(profiling, name)
    raise AttributeError(f"module 'kvscope' has no attribute {name!r}")
