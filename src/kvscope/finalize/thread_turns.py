"""Conversation turns: which invocation of its thread each call was made in (`thread_turn`).

A thread's invocations (its rows' distinct workflow_run_ids) numbered from 1 in the order of
their first call's start_ns (ties: by workflow_run_id). Computed once over the whole run, so a
thread whose invocations ran in several processes (`kvscope profile`'s forked workers, a server
answering from a pool) is numbered once, and the probe keeps nothing per thread while the app
runs. A row with no thread_id or no workflow_run_id (a call outside any graph invocation) has
no turn (null). Invocations that made no model call are not rows, so they are not counted.
"""

from collections.abc import Sequence

from kvscope.records.base import Row


def with_thread_turns(rows: Sequence[Row]) -> list[Row]:
    """The rows with `thread_turn` set as above, in place (the same rows, as a list)."""
    first: dict[tuple[str, str], tuple[bool, int]] = {}
    for r in rows:
        thread, workflow = r.get("thread_id"), r.get("workflow_run_id")
        if thread is None or workflow is None:
            continue
        start = r.get("start_ns")
        when = (start is None, start or 0)  # a call with no start time sorts last
        key = (thread, workflow)
        if key not in first or when < first[key]:
            first[key] = when
    turns: dict[tuple[str, str], int] = {}
    seen: dict[str, int] = {}
    for (thread, workflow), _ in sorted(first.items(), key=lambda kv: (kv[0][0], kv[1], kv[0][1])):
        seen[thread] = turns[(thread, workflow)] = seen.get(thread, 0) + 1
    for r in rows:
        r["thread_turn"] = turns.get((r.get("thread_id"), r.get("workflow_run_id")))
    return list(rows)
