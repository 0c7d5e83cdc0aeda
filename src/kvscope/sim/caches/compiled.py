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

import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

COMPILED_FROM_BLOCKS = 1_000_000  # below, the Python pool is done before numba has loaded


def worth_compiling(blocks: int) -> bool:
    return blocks >= COMPILED_FROM_BLOCKS


def loaded() -> bool:
    """Whether numba is loaded in this process already (then compiling costs no start-up)."""
    return "numba" in sys.modules


def compiled(**options: Any) -> Callable[[F], F]:
    """numba.njit with its on-disk cache; without one (numba finds no writable directory for
    it: beside this module, nor its user cache), compiled anew in each process instead."""
    numba = _numba()

    def jit(fn: F) -> F:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(**options)(fn)

    return jit


def _numba() -> ModuleType:
    """numba, its BLAS probe deferred. numba.np.arraymath imports scipy.linalg when it is itself
    imported, only to learn whether BLAS is there (np.dot inside compiled code): ~0.2 s of CPU
    and ~20 MB in every process that loads a kernel, none of which calls BLAS. So that import
    runs with scipy.linalg hidden, and the flag is then set to what the probe would have found
    (scipy installed): np.dot in compiled code, kvscope's or the app's, loads BLAS when it is
    first compiled, as numba does for np.linalg. Where scipy.linalg or numba's arraymath is
    loaded already, nothing is hidden."""
    hide = not {"scipy.linalg", "numba.np.arraymath"} & sys.modules.keys()
    if hide:
        sys.modules["scipy.linalg"] = None  # type: ignore[assignment]  # import -> ImportError
    try:
        import numba
        import numba.np.arraymath as arraymath
    finally:
        if hide and sys.modules.get("scipy.linalg", 0) is None:
            del sys.modules["scipy.linalg"]
    if hide:
        arraymath._HAVE_BLAS = importlib.util.find_spec("scipy") is not None
    return numba
