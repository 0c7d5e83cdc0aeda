"""langchain-core's run context, where the app has langchain-core (LangGraph apps do): its
callback handler base, its configure hook and the running node's config. Where the app's
interpreter has no langchain-core (an Agents SDK, CrewAI or AutoGen app in its own virtualenv,
probe/lite.py), there are no LangChain runs to track: the base is `object`, the hook is never
registered and the config is empty.
"""

from collections.abc import Mapping
from typing import Any

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.runnables.config import var_child_runnable_config
    from langchain_core.tracers.context import register_configure_hook
except ImportError:  # pragma: no cover - kvscope's own environment has langchain-core
    BaseCallbackHandler = object  # type: ignore[assignment,misc]
    var_child_runnable_config = None  # type: ignore[assignment]
    register_configure_hook = None  # type: ignore[assignment]

HAS_LANGCHAIN = var_child_runnable_config is not None


def current_config() -> Mapping[str, Any]:
    """The config of the LangChain run whose code is running here ({}: none, or no
    langchain-core)."""
    if var_child_runnable_config is None:
        return {}
    return var_child_runnable_config.get() or {}
