"""When a live replay sends each call: a pure schedule over recorded (workflow, start, end) records.

- `session` pacing: a workflow's call fires when the calls it followed have completed *in the
  replay*, plus the recorded gap between them (tool time, think time; a negative gap is 0).
  Call k's predecessors are the earlier calls of its workflow that had ended when k started
  (recorded), less those that another of them followed (a chain waits on its last link); it
  fires at max over them of (their replayed completion + start_k - their end).
  Calls of one workflow that started before the previous one ended (a fan-out) both follow their
  common predecessor, so they start together again. A workflow's first call that started after
  other workflows had ended (recorded) took the slot of the latest of them (a driver's
  concurrency limit): it fires the recorded gap after that workflow's last call completes; each
  ended workflow frees one slot. Any other first call fires at its recorded offset from the
  trace's first start, so workflows overlap as they did. A workflow's later calls never wait on
  another workflow's. A call without a workflow (None) is on its own and fires at its offset.
- `open-loop` pacing: every call fires at its recorded offset from the trace's first start,
  whatever the engine does meanwhile.

`schedule(...)` returns one `Timing` per call; the executor (live/run.py) waits on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvscope.errors import KvscopeError

PACINGS = ("session", "open-loop")


@dataclass(frozen=True)
class Timing:
    """Call `index` fires at `offset_s` after the replay began (None: no such floor) and, for
    every (j, gap_s) in `after`, no earlier than gap_s after call j completed."""

    index: int
    offset_s: float | None
    after: tuple[tuple[int, float], ...] = ()


def check_pacing(pacing: str) -> str:
    if pacing not in PACINGS:
        raise KvscopeError(f"unknown pacing {pacing!r}; known: {', '.join(PACINGS)}")
    return pacing


def schedule(
    pacing: str,
    workflows: Sequence[str | None],
    start_s: Sequence[float],
    end_s: Sequence[float],
) -> list[Timing]:
    """The Timing of every call (index order), under `pacing` (see the module doc)."""
    check_pacing(pacing)
    n = len(start_s)
    if len(workflows) != n or len(end_s) != n:
        raise ValueError("workflows, start_s and end_s must have the same length")
    if n == 0:
        return []
    t0 = min(start_s)
    if pacing == "open-loop":
        return [Timing(i, max(start_s[i] - t0, 0.0)) for i in range(n)]
    by_workflow: dict[object, list[int]] = {}
    for i, workflow in enumerate(workflows):
        key: object = ("no-workflow", i) if workflow is None else workflow
        by_workflow.setdefault(key, []).append(i)
    out: list[Timing | None] = [None] * n
    slots = _slots(by_workflow, start_s, end_s)
    for calls in by_workflow.values():
        calls.sort(key=lambda i: (start_s[i], end_s[i], i))
        for pos, k in enumerate(calls):
            before = [j for j in calls[:pos] if end_s[j] <= start_s[k]]
            if not before and k in slots:
                j = slots[k]
                out[k] = Timing(k, None, ((j, max(start_s[k] - end_s[j], 0.0)),))
                continue
            if not before:
                out[k] = Timing(k, max(start_s[k] - t0, 0.0))
                continue
            latest = max(before, key=lambda j: (start_s[j], j))
            direct = [j for j in before if j == latest or end_s[j] > start_s[latest]]
            after = tuple((j, max(start_s[k] - end_s[j], 0.0)) for j in direct)
            out[k] = Timing(k, None, after)
    return [t for t in out if t is not None]


def _slots(
    by_workflow: dict[object, list[int]], start_s: Sequence[float], end_s: Sequence[float]
) -> dict[int, int]:
    """first call of a workflow -> the last call of the workflow whose slot it took: the latest
    workflow to have ended (recorded) before it started, each ended workflow taken once (a
    driver's concurrency limit: a queued workflow starts when a running one ends)."""
    named = [calls for key, calls in by_workflow.items() if not isinstance(key, tuple)]
    firsts = sorted(
        (min(c, key=lambda i: (start_s[i], i)) for c in named), key=lambda i: start_s[i]
    )
    lasts = sorted((max(c, key=lambda i: (end_s[i], i)) for c in named), key=lambda i: end_s[i])
    free: list[int] = []
    out: dict[int, int] = {}
    pos = 0
    for k in firsts:
        while pos < len(lasts) and end_s[lasts[pos]] <= start_s[k]:
            free.append(lasts[pos])
            pos += 1
        if free:
            out[k] = free.pop()  # the most recently ended
    return out


def fire_time(timing: Timing, began: float, completed: dict[int, float]) -> float:
    """When `timing`'s call fires (the clock of `began`), given its predecessors' completions."""
    times = [began + timing.offset_s] if timing.offset_s is not None else []
    times += [completed[j] + gap for j, gap in timing.after]
    return max(times) if times else began
