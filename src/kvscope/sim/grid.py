"""Run a replay's cells (one policy at one capacity each) in parallel processes.

    results = run_cells(cell, [("lru", 4096), ("belady", 4096)], jobs=2, on_done=...)

`cell(policy, capacity)` is any callable (a closure over the loaded trace is the point): it is
never pickled. The worker processes are forked after it is put in a module global, so each
inherits the trace already loaded (copy-on-write; nothing is sent per cell but the cell's
`(policy, capacity)` and its result back). Contracts:

- The results are in `cells`' order, and equal what `[cell(p, c) for p, c in cells]` returns.
- `on_done(policy, capacity)` is called in this (the parent) process once per cell, as each
  finishes (completion order).
- An exception in a cell is raised here as itself (same type and message); when several cells
  fail, the one sequential order would have raised first (cells not started after it are
  cancelled). A worker that dies (killed, out of memory) is a KvscopeError saying so.
- `jobs <= 1`, a single cell, or a platform without the fork start method: the cells run here,
  one after another (today's path, no processes).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from kvscope.errors import KvscopeError

T = TypeVar("T")
Cell = tuple[str, int]  # (policy, capacity in tokens)

_WORK: Callable[[str, int], Any] | None = None  # set in the parent just before the fork


def default_jobs() -> int:
    """The machine's CPU count (os.cpu_count(); 1 when unknown)."""
    return os.cpu_count() or 1


def _run_forked(policy: str, capacity: int) -> Any:
    """In a forked worker: the inherited cell function on one cell."""
    assert _WORK is not None, "grid worker started without its work (not forked?)"
    return _WORK(policy, capacity)


def run_cells(
    cell: Callable[[str, int], T],
    cells: Sequence[Cell],
    jobs: int = 1,
    on_done: Callable[[str, int], None] = lambda _p, _c: None,
) -> list[T]:
    """`cell` on every one of `cells`, on up to `jobs` processes: the module doc's contract."""
    if jobs < 1:
        raise KvscopeError(f"--jobs must be at least 1, got {jobs}")
    jobs = min(jobs, len(cells))
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for policy, capacity in cells:
            out.append(cell(policy, capacity))
            on_done(policy, capacity)
        return out
    return _run_parallel(cell, cells, jobs, on_done)


def _run_parallel(
    cell: Callable[[str, int], T],
    cells: Sequence[Cell],
    jobs: int,
    on_done: Callable[[str, int], None],
) -> list[T]:
    global _WORK
    _WORK = cell
    results: dict[int, T] = {}
    failures: dict[int, BaseException] = {}
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            index: dict[Future[T], int] = {
                pool.submit(_run_forked, p, c): i for i, (p, c) in enumerate(cells)
            }
            pending = set(index)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=index.__getitem__):
                    i = index[future]
                    if future.cancelled():
                        continue
                    error = future.exception()
                    if error is None:
                        results[i] = future.result()
                        on_done(*cells[i])
                        continue
                    failures[i] = error
                    for later, j in index.items():  # sequential order would stop here
                        if j > i:
                            later.cancel()
    except BrokenProcessPool as err:
        raise KvscopeError(
            f"a replay worker process died ({err}); out of memory? rerun with --jobs 1"
        ) from None
    finally:
        _WORK = None
    if failures:
        first = failures[min(failures)]
        if isinstance(first, BrokenProcessPool):
            raise KvscopeError(
                f"a replay worker process died ({first}); out of memory? rerun with --jobs 1"
            ) from None
        raise first
    return [results[i] for i in range(len(cells))]
