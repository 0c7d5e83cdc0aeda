"""The call streams of a capture: requests, prompt token ids, tool runs and trace payloads.

One writer per stream, each record flushed as it is written: JSON lines, but the prompt token
ids, an Arrow IPC stream (records.tokens). A process that captures for a session it does not own
(a profiled program, probe/child.py) writes its own part files, `<stream>.<pid>`, which the owner
merges into the streams on close.

A finished call's row is built and written by a background thread (probe/offload.py), not on the
app's thread; `close` waits for it, so a run that ends normally (the session's close, or the
interpreter's exit in a profiled program) loses no finished call; a process killed by a signal
loses the rows still queued (normally a few milliseconds' worth). A row is built inline when the
app has an MLflow span active around the call (probe/app_spans.py puts kvscope's measurements on
it, in the app's own context), when the queue is full (counted), and in a forked process (one
that may end with os._exit, as multiprocessing's workers do). What the worker did is recorded in
run.json's `capture.probe_queue` (`offloaded`, `inline`: rows built on the app's thread because
the queue was full, `failed`, `error`, `died`), the profiled program's processes' summed in.
"""

import dataclasses
import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from kvscope.config import HintPolicy
from kvscope.errors import WriteError
from kvscope.probe import app_spans
from kvscope.probe.hints import make_hints
from kvscope.probe.instrument import PromptInstrument
from kvscope.probe.offload import Job, Offload, OffloadStats
from kvscope.probe.tokens import ChatTokenizer
from kvscope.probe.wire import CallContext, RunInfo
from kvscope.records.base import ArrowWriter, JsonlWriter, compact
from kvscope.records.payloads import PAYLOADS_JSONL, CallPayload
from kvscope.records.requests import REQUESTS_JSONL, RequestRecord
from kvscope.records.run_dir import RUN_JSON
from kvscope.records.tokens import TOKENS_ARROW, TOKENS_SCHEMA, PromptTokenIds
from kvscope.records.tools import TOOLS_JSONL, ToolCall

STREAMS = (REQUESTS_JSONL, TOOLS_JSONL, PAYLOADS_JSONL)  # JSON lines
PROBE_QUEUE = "probe_queue.json"  # a profiled process's OffloadStats, `probe_queue.json.<pid>`
log = logging.getLogger(__name__)
Writer = JsonlWriter[Any] | ArrowWriter[Any]


class CallStreams:
    def __init__(
        self, run_dir: Path, *, tokens: bool, payloads: bool, part: str = "", offload: bool = True
    ) -> None:
        """`tokens`: whether calls can have prompt token ids (a tokenizer, or an engine that
        returns them): then prompt_tokens.arrow is written. `part`: "" for the session's own
        streams, `.<pid>` for a part file of another process. `offload`: build and write rows
        on a background thread (False: on the app's thread, as each call ends)."""
        self.run_dir, self.has_tokens, self.has_payloads = run_dir, tokens, payloads
        self.on_row: Callable[[RequestRecord], None] = lambda _: None
        self.write_error: WriteError | None = None  # the first file the disk refused
        self.offload: Offload | None = Offload() if offload else None
        self._open(part)

    def _open(self, part: str) -> None:
        run_dir, self.part = self.run_dir, part
        self.requests: JsonlWriter[Flat] = JsonlWriter(run_dir / (REQUESTS_JSONL + part))
        self.tools: JsonlWriter[ToolCall] = JsonlWriter(run_dir / (TOOLS_JSONL + part))
        self.tokens: ArrowWriter[PromptTokenIds] | None = (
            token_writer(run_dir / (TOKENS_ARROW + part)) if self.has_tokens else None
        )
        self.payloads: JsonlWriter[Flat] | None = (
            JsonlWriter(run_dir / (PAYLOADS_JSONL + part)) if self.has_payloads else None
        )

    def reopen(self, part: str) -> None:
        """Write to other part files from now on (a forked process: its own pid's, its rows
        built inline: the parent's worker thread is not in it)."""
        self.offload = None
        self._open(part)

    def context(
        self,
        run: RunInfo,
        chat: ChatTokenizer | None,
        store_prompts: bool,
        hints: HintPolicy | None = None,
    ) -> CallContext:
        """The CallContext whose rows, token ids and payloads go to these streams; `hints`: the
        eviction hint policy that sets each call's engine priority (probe/hints.py)."""
        return CallContext(
            **run.to_dict(),
            sink=self.row,
            instrument=PromptInstrument(
                chat, self.token if self.has_tokens else None, store_prompts
            ),
            payload_sink=self.payload if self.has_payloads else None,
            hints=make_hints(hints),
            offload=self.defer,
        )

    def defer(self, job: Job) -> bool:
        """Hand a finished call's row-building job to the worker; False: the caller runs it now
        (no worker, the queue full, or the app's own MLflow span to annotate in its context)."""
        if self.offload is None or app_spans.active():
            return False
        return self.offload.submit(job)

    def row(self, record: RequestRecord) -> None:
        record = app_spans.annotate(record)
        self._append(self.requests, Flat(record))
        self.on_row(record)

    def token(self, ids: PromptTokenIds) -> None:
        if self.tokens is not None:
            self._append(self.tokens, ids)

    def tool(self, call: ToolCall) -> None:
        job = functools.partial(
            self._append, self.tools, call if self.has_payloads else call.without_text()
        )
        if self.offload is None or not self.offload.submit(job):
            job()

    def payload(self, payload: CallPayload) -> None:
        if self.payloads is not None:
            self._append(self.payloads, Flat(payload))

    def _append(self, writer: Writer, record: Any) -> None:
        """Append; the first WriteError (a full disk) is kept in `write_error` and raised."""
        try:
            writer.append(record)
        except WriteError as err:
            self.write_error = self.write_error or err
            raise

    def writers(self) -> list[Writer]:
        return [w for w in (self.requests, self.tools, self.tokens, self.payloads) if w]

    def close(self) -> None:
        """Write what is queued, close the writers and record what the worker did; the session's
        own streams also take in other processes' parts."""
        stats = self.offload.close() if self.offload is not None else None
        for writer in self.writers():
            writer.close()
        if self.part:
            if stats is not None:
                (self.run_dir / (PROBE_QUEUE + self.part)).write_text(json.dumps(stats.to_dict()))
            return
        merge_parts(self.run_dir)
        record_queue_stats(self.run_dir, stats)


class Flat:
    """A record whose fields are JSON values (a request row, a payload: what JSON gave) as its
    line's dict: its fields as they are, where the record's own to_dict (dataclasses.asdict)
    deep-copies them, at 5 times the cost; the same line."""

    __slots__ = ("record",)

    def __init__(self, record: Any) -> None:
        self.record = record

    def to_dict(self) -> dict[str, Any]:
        record = self.record
        return {name: getattr(record, name) for name in _field_names(type(record))}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def record_queue_stats(run_dir: Path, own: OffloadStats | None) -> OffloadStats | None:
    """The session's and its programs' OffloadStats, summed into run.json's
    `capture.probe_queue` (where there is a run.json); a warning when rows were built inline
    for a full queue, or failed. The programs' `probe_queue.json.<pid>` files are removed."""
    total = own
    for part in sorted(run_dir.glob(PROBE_QUEUE + ".*")):
        try:
            theirs = OffloadStats(**json.loads(part.read_text()))
        except (ValueError, TypeError):
            continue
        total = theirs if total is None else total.add(theirs)
        part.unlink()
    if total is not None and (total.inline or total.failed or total.died):
        died = f"; the row writer thread stopped: {total.died}" if total.died else ""
        log.warning(
            "kvscope: rows built on the app's thread for a full queue: %d; rows that could not "
            "be written: %d (%s)%s", total.inline, total.failed, total.error, died,
        )  # fmt: skip
    run_json = run_dir / RUN_JSON
    if total is None or not run_json.exists():
        return total
    run = json.loads(run_json.read_text())
    run["capture"] = (run.get("capture") or {}) | {"probe_queue": total.to_dict()}
    run_json.write_text(json.dumps(run, indent=2, default=str))
    return total


def token_writer(path: Path) -> ArrowWriter[PromptTokenIds]:
    """The appender of a prompt-token stream (records.tokens: one record batch per call)."""
    return ArrowWriter(path, TOKENS_SCHEMA, PromptTokenIds.to_batch)


def merge_parts(run_dir: Path) -> int:
    """Append every `<stream>.<pid>` part file to its stream, in pid order, and remove it; how
    many parts were merged. A part is removed only once its records are in the stream: a crash
    while merging leaves it to be merged again (a prompt-token record twice: its last wins).
    The prompt-token stream is also rewritten in large batches (records.base.compact)."""
    merged = _merge_arrow(run_dir, TOKENS_ARROW, TOKENS_SCHEMA)
    for name in STREAMS:
        parts = sorted(run_dir.glob(f"{name}.*"), key=lambda p: p.suffix)
        if not parts:
            continue
        with (run_dir / name).open("ab") as out:
            for part in parts:
                data = part.read_bytes()
                if data and not data.endswith(b"\n"):  # a torn last line: keep it on its own
                    data += b"\n"
                out.write(data)
                part.unlink()
                merged += 1
    return merged


def _merge_arrow(run_dir: Path, name: str, schema: pa.Schema) -> int:
    """The Arrow stream's parts appended to it, batch by batch (torn tails left off), and the
    stream rewritten in large batches (records.base.compact); how many parts were merged."""
    parts = sorted(run_dir.glob(f"{name}.*"), key=lambda p: p.suffix)
    if (run_dir / name).exists() or parts:
        compact(run_dir / name, schema, parts)
    return len(parts)
