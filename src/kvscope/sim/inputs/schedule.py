"""When the engine scheduled each call of a run: the replay's request order and start times.

The engine looks a prompt up in its prefix cache, and takes its blocks, when its scheduler
admits the request, not when the client sent it. Between the two lie the API server's front end
and the engine's queue, which reorder calls sent a few ms apart (parallel branches of a fan-out
do this: the second branch sent can be the first scheduled, and then the hit on the blocks they
share goes to the other one).

`scheduled_start(row)`: with the client's TTFT and the engine's own prefill time (scheduled ->
first token, which vLLM's and SGLang's per-request metrics report), the first token's arrival
minus the prefill; otherwise the submission clock plus the engine's queue time
(provenance.admitted_ns: an unknown queue time leaves the submission clock).

Calls the engine admitted in one step share a scheduled time within the clocks' jitter, and
neither their sending order nor their first tokens' order is the engine's (both were seen
reversed on vLLM). So starts within `SAME_STEP_S` of each other (a chain of such gaps) form a
step, whose calls `step_order` puts in the engine's order as far as the engine recorded it:

1. the calls that stored blocks in the step's first KV event batch (BlockStored names the
   request: `session_id`) in the order of their first stored block: the scheduling order;
2. a call that stored nothing there (its prompt's full blocks were all hits) after every step
   peer that stored a block it hit (`after(call, peer)`); otherwise in sending order.

The step's scheduled times are then handed out, ascending, in that order.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from kvscope.finalize.provenance import admitted_ns
from kvscope.records.kv_events import KV_EVENTS_PARQUET, events_of, events_path, read_batches_in

SAME_STEP_S = 0.005  # below one engine step; above the jitter of first-token arrival times

StoreAt = tuple[int, int]  # (seq of the KV event batch, rank of the stored block in the stream)


def scheduled_start(row: dict[str, Any]) -> float:
    """One row's scheduled time (seconds; see the module doc), before same-step ordering."""
    start = float(row["start_ns"]) / 1e9
    ttft, prefill = row.get("ttft_ms"), row.get("prefill_ms")
    if ttft is not None and prefill is not None and 0 <= prefill <= ttft:
        return start + (float(ttft) - float(prefill)) / 1e3
    return admitted_ns(row) / 1e9


def first_stores(run_dir: Path) -> dict[str, StoreAt]:
    """request_uuid -> where its first BlockStored is in the engine's KV event stream.

    From kv_events.parquet when finalize wrote it, else the KV event stream; empty without either
    (an engine without KV events, or one that does not name the request)."""
    if (run_dir / KV_EVENTS_PARQUET).exists():
        table = pq.read_table(run_dir / KV_EVENTS_PARQUET, columns=["seq", "kind", "session_id"])
        cols = (table[c].to_pylist() for c in ("seq", "kind", "session_id"))
        triples = zip(*cols, strict=True)
    elif events_path(run_dir) is not None:
        batches, _ = read_batches_in(run_dir)
        triples = ((b.seq, e.kind, e.session_id) for b, e in events_of(batches))
    else:
        return {}
    first: dict[str, StoreAt] = {}
    for rank, (seq, kind, session) in enumerate(triples):
        if kind == "stored" and session is not None and session not in first:
            first[session] = (seq, rank)
    return first


def scheduled_starts(
    rows: Sequence[dict[str, Any]],
    stores: Mapping[str, StoreAt] | None = None,
    after: Callable[[int, int], bool] | None = None,
) -> np.ndarray:
    """Every row's scheduled time, same-step calls in the engine's order (module doc).

    `stores`: `first_stores` of the run (None or empty: same-step calls in sending order).
    `after(i, j)`: row i's prompt holds a block that row j stored (None: never)."""
    stores = stores or {}
    starts = np.array([scheduled_start(r) for r in rows], dtype=np.float64)
    sent = [float(r["start_ns"]) for r in rows]
    at = [stores.get(r["request_uuid"]) for r in rows]
    order = np.argsort(starts, kind="stable")
    gaps = np.diff(starts[order]) >= SAME_STEP_S
    out = starts.copy()
    for group in np.split(order, np.flatnonzero(gaps) + 1):
        if len(group) > 1:
            out[step_order(group.tolist(), sent, at, after)] = starts[group]
    return out


def step_order(
    group: list[int],
    sent: Sequence[float],
    at: Sequence[StoreAt | None],
    after: Callable[[int, int], bool] | None,
) -> list[int]:
    """One step's calls (indices) in the engine's order (rules 1 and 2 of the module doc).

    The stored calls keep their order; each other call, in sending order, goes right after the
    last stored call it hit (in that order), else right before the first stored call sent after
    it (every other call placed before it was sent no later), else last. Placed as a linked list
    (no list insertion, no scan of the calls placed): a step of a busy run can hold most of it."""
    seqs = [at[i][0] for i in group if at[i] is not None]
    batch = min(seqs) if seqs else None
    stored = sorted(
        (i for i in group if at[i] is not None and at[i][0] == batch),
        key=lambda i: at[i][1],  # type: ignore[index]
    )
    stored_set = set(stored)
    head = -1  # a sentinel before the first call
    nxt: dict[int, int | None] = {head: None}
    prv: dict[int, int] = {}

    def insert_after(x: int, i: int) -> None:
        y = nxt[x]
        nxt[x], nxt[i], prv[i] = i, y, x
        if y is not None:
            prv[y] = i

    tail = head
    for j in stored:
        insert_after(tail, j)
        tail = j
    latest = list(itertools.accumulate((sent[j] for j in stored), max))  # non-decreasing
    for i in sorted((i for i in group if i not in stored_set), key=lambda i: sent[i]):
        hit = next((j for j in reversed(stored) if after(i, j)), None) if after else None
        k = bisect.bisect_right(latest, sent[i])  # the first stored call sent after i
        insert_after(hit if hit is not None else prv[stored[k]] if k < len(stored) else tail, i)
        if nxt[i] is None:
            tail = i
    placed, x = [], nxt[head]
    while x is not None:
        placed.append(x)
        x = nxt[x]
    return placed
