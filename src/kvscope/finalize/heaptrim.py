"""Freed C heap memory handed back to the system between the steps of a finalize pass.

glibc serves a pass's numpy temporaries of a few MB from its heap once it has raised its mmap
threshold (it does when such an array is freed), and it keeps freed heap memory resident: up to
twice that threshold at the top of the heap, and every free page below it. The steps that follow
(row dicts from Python's own arenas, Arrow's buffers from its pool) never reuse that memory, so
it only adds to the process's peak: ~50 MiB of a 100k-request finalize (bench/provenance.py).
`release()` asks glibc to return it (malloc_trim); with another C library it does nothing.
"""

import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release() -> None:
    """Return the C heap's free pages to the system (a few ms; nothing where unsupported)."""
    if _TRIM is not None:
        _TRIM(0)


@contextmanager
def arrow_on_heap() -> Iterator[None]:
    """Arrow's buffers come from the C heap (its system pool) inside, so that release() returns
    them too: its default pool (mimalloc) kept ~150 MiB of freed segments resident after
    reading a 100k-row request stream, and pyarrow's release_unused() returned little of it."""
    before = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)
