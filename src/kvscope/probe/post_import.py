"""Code run when a module is first imported: how the framework readers (probe/openai_agents.py,
crewai.py, autogen.py) install on a framework only once the app imports it, importing nothing
of it themselves.

`when_imported(name, hook)` calls `hook(module)` at once where `name` is imported already, else
right after the module's code has run on its first import (a finder first on `sys.meta_path`,
one for all hooks, wrapping the module's loader; modules found by Python's own path finder, as
installed packages are). Standard library only: it runs in the app's interpreter.
"""

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], Any]
_HOOKS: dict[str, list[Hook]] = {}  # module name -> what runs once it is executed
_LOCK = threading.Lock()
_FINDERS: list[importlib.abc.MetaPathFinder] = []


def when_imported(name: str, hook: Hook) -> None:
    """`hook(module)` once the module `name` has been executed (now, if it has)."""
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    with _LOCK:
        _HOOKS.setdefault(name, []).append(hook)
        if not _FINDERS:
            _FINDERS.append(_Finder())
            sys.meta_path.insert(0, _FINDERS[0])


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _HOOKS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_hook(module: ModuleType) -> None:
            exec_module(module)
            with _LOCK:
                hooks = _HOOKS.pop(name, [])
            for hook in hooks:
                hook(module)

        loader.exec_module = exec_and_hook
        return spec
