"""When LangGraph's Functional API launched each `@task`: the moment the caller's code called it.

A `@task` call returns a future at once and the task runs in a worker thread (sync) or an asyncio
task, so when it *started* is not when it was launched: a task waits for a free worker when more
are launched together than the thread pool has (min(32, CPUs + 4), or the run's
`max_concurrency`), and a fast one may end before the caller launches the next. Which tasks
were launched together (parallel) and which after another one ended (sequential) is read from
the launch, which langchain-core's callbacks do not report. So while a tracker is active,
`langgraph.func`'s task callable is wrapped: before LangGraph schedules the task, the tracker is
told (`RunTracker.launched`) in the caller's thread, with the caller's config; the task's run,
when it starts, finds its launch by the caller's namespace and the call's index (the third
element of its `langgraph_path`, LangGraph's count of the caller's task calls).

`install()` needs `langgraph.func` imported already (it is, once an app has built an entrypoint
or a task) and never imports it: the tracker calls it when it is activated and again when a graph
invocation starts (before the entrypoint's code runs); it is cheap and idempotent, and
`uninstall()` (the tracker's last deactivation) restores the original. The
wrapper calls the original whatever happens on kvscope's side: a tracker error is swallowed.
"""

import functools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from kvscope.probe.langchain_context import current_config

log = logging.getLogger(__name__)

Tracker = Any  # RunTracker (probe/run_tracker.py imports this module)
_ORIGINAL: list[Callable[..., Any]] = []  # the task callable's own __call__, while wrapped
_LOCK = threading.Lock()  # invocations may start in several threads at once: one wrapper


def install(tracker: Callable[[], Tracker | None]) -> bool:
    """Wrap `langgraph.func._TaskFunction.__call__` (if imported): each call tells `tracker()`
    (the active one at that moment, None: no one) before LangGraph schedules the task."""
    if _ORIGINAL:
        return True
    with _LOCK:
        return _install(tracker)


def _install(tracker: Callable[[], Tracker | None]) -> bool:
    cls = _task_class()
    if cls is None or _ORIGINAL:
        return cls is not None
    original = cls.__call__

    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        active = tracker()
        launch = None
        if active is not None:
            try:
                launch = active.launched(current_config())
            except Exception:  # never the app's failure
                log.debug("could not record a task launch", exc_info=True)
        try:
            return original(self, *args, **kwargs)
        except BaseException:
            if launch is not None:
                active.unlaunched(launch)  # LangGraph refused it: not counted as a call
            raise

    cls.__call__ = __call__
    _ORIGINAL.append(original)
    return True


def uninstall() -> None:
    with _LOCK:
        cls = _task_class()
        if cls is not None and _ORIGINAL:
            cls.__call__ = _ORIGINAL.pop()


def _task_class() -> type | None:
    module = sys.modules.get("langgraph.func")
    cls = getattr(module, "_TaskFunction", None)
    return cls if isinstance(cls, type) and "__call__" in vars(cls) else None
