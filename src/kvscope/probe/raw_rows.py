"""The lite probe's calls as rows: each recorded call (probe/raw_call.py, `raw_calls.jsonl.<pid>`
part files of a program's processes where kvscope is not installed) is read back through
kvscope's own call (probe/wire.InFlight) on the profiling process's engine and call context, so
its row, prompt columns (from the ids the engine returned, else tokenized here) and payload are
made by the same code as a call kvscope parsed as it happened, on the clock the probe recorded.

The replayed call carries the eviction-hint priority the lite probe sent (none where it sent
none): the row says what the engine got. A part is removed once its calls are rows; an
unreadable line (a torn write) is skipped and counted.
"""

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvscope.engines.base import Engine
from kvscope.probe.identity import CallIdentity
from kvscope.probe.measure import failure_named
from kvscope.probe.raw_call import RAW_CALLS_JSONL
from kvscope.probe.wire import CallContext, InFlight
from kvscope.records.base import read_jsonl

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replayed:
    calls: int  # rows made
    unreadable: int  # lines skipped (a torn write)


def replay_parts(run_dir: Path, engine: Engine, ctx: CallContext) -> Replayed:
    """Every raw call part of `run_dir` as rows through `ctx`, in pid order; parts removed."""
    ctx = replace(ctx, hints=None)
    calls = unreadable = 0
    for part in sorted(run_dir.glob(RAW_CALLS_JSONL + ".*"), key=lambda p: p.suffix):
        raws, bad = read_jsonl(part)
        unreadable += bad
        for raw in raws:
            try:
                row_of(raw, engine, ctx)
                calls += 1
            except (KeyError, TypeError, ValueError, AttributeError) as err:  # not a call record
                log.warning("kvscope: %s: a call record that is not one (%s): skipped", part, err)
                unreadable += 1
        part.unlink()
    return Replayed(calls, unreadable)


def row_of(raw: dict[str, Any], engine: Engine, ctx: CallContext) -> None:
    """One recorded call read through InFlight: its row goes to ctx.sink."""
    priority = raw.get("priority")
    if priority is not None:  # what the lite probe sent, in the engine's field for it
        ctx = replace(ctx, hints=lambda _: priority)
    call = InFlight(
        ctx,
        engine,
        raw["body"],
        CallIdentity(**raw["identity"]),
        responses=raw["responses"],
        request_uuid=raw["request_uuid"],
        clock=(raw["start_ns"], 0.0),
    )
    if raw["status_code"] is not None:
        call.replied(raw["status_code"], raw["headers"])
    for at, text in raw["chunks"]:
        call.feed(text.encode("latin-1"), at)
    call.flush(raw["end"])
    error = raw["error"]
    problem = (
        failure_named(error["types"], error["message"], error["status_code"]) if error else None
    )
    call.finish(problem, early=raw["early"], t_end=raw["end"])
