"""The cyclic garbage collector paused over a finalize pass.

The passes allocate hundreds of thousands of containers (block lives, row dicts) and free
none of them until they return, so every collection the allocations trigger walks a growing
heap to find nothing: at 200k block lives that was most of the ledger's time. Reference counting
still frees everything as usual; the collector is re-enabled (if it was on) when the pass ends.
"""

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def without_gc(f: Callable[P, R]) -> Callable[P, R]:
    """f, run with the cyclic collector paused."""

    @wraps(f)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with gc_paused():
            return f(*args, **kwargs)

    return run
