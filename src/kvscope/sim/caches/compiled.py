"""Compiled loops of the simulator: numba's njit with its on-disk cache, and when they pay.

A function is compiled to machine code on its first call and the code is kept on disk (beside
its module, or numba's user cache directory when that is not writable), so later processes only
load it. Where numba finds no writable directory at all, it is compiled anew in each process
instead (a few seconds), never refused. numba's cache checks only the file of the function it
compiled: a kernel's file holds every compiled function it calls.

Loading numba and the first cached function costs a process ~0.6 s CPU (LLVM's start-up), which
the Python paths do not pay: `worth_compiling(blocks)` says whether a replay of that many blocks
(a trace's keys times the cells that replay them) is large enough for the compiled path to win
(the Python pool takes ~0.7 us a block, the kernel ~10-20 ns). This module imports numba only
when a function is compiled, so the threshold costs nothing to ask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

COMPILED_FROM_BLOCKS = 1_000_000  # below, the Python pool is done before numba has loaded


def worth_compiling(blocks: int) -> bool:
    return blocks >= COMPILED_FROM_BLOCKS


def compiled(**options: Any) -> Callable[[F], F]:
    """numba.njit with its on-disk cache; without one (numba finds no writable directory for
    it: beside this module, nor its user cache), compiled anew in each process instead."""
    import numba

    def jit(fn: F) -> F:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(**options)(fn)

    return jit
