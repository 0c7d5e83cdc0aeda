"""Compiled loops of the simulator: numba's njit with its on-disk cache.

A function is compiled to machine code on its first call and the code is kept on disk (beside
its module, or numba's user cache directory when that is not writable), so later processes only
load it (~0.2 s a function). Where numba finds no writable directory at all, it is compiled anew
in each process instead (a few seconds), never refused. numba's cache checks only the file of
the function it compiled: a kernel's file holds every compiled function it calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numba

F = TypeVar("F", bound=Callable[..., Any])


def compiled(**options: Any) -> Callable[[F], F]:
    """numba.njit with its on-disk cache; without one (numba finds no writable directory for
    it: beside this module, nor its user cache), compiled anew in each process instead."""

    def jit(fn: F) -> F:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(**options)(fn)

    return jit
