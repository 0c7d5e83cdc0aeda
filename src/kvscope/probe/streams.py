"""The call streams of a capture: requests, prompt token ids and columns, tool runs, payloads.

One writer per stream, each record flushed as it is written (a crash loses no finished call):
JSON lines, but the prompt token ids, an Arrow IPC stream (records.tokens). A process that
captures for a session it does not own (a profiled program, probe/child.py) writes its own part
files, `<stream>.<pid>`, which the owner merges into the streams on close.

A call's end is handed off the app's thread (`defer`, the context's): the background thread
(probe/background.py) builds its row (with the prompt columns where the engine returned the ids)
and writes it, its payload and its token ids; a row is in its file ~20 ms after its call ended.
Where the app has an MLflow span of its own active, the call ends on the app's thread instead
(probe/app_spans.py puts kvscope's measurements on that span, which only that thread sees).
A call whose prompt ids need the tokenizer has them made by a tokenizer process
(probe/tokenizer_process.py, part files of its own), the background thread handing them over;
its prompt columns follow its row in prompt_columns.jsonl (records/prompt_columns.py). `close`
first runs what the background thread has queued and waits for the process.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from kvscope.config import HintPolicy
from kvscope.errors import WriteError
from kvscope.probe import app_spans
from kvscope.probe.background import Background
from kvscope.probe.hints import make_hints
from kvscope.probe.instrument import PromptInstrument
from kvscope.probe.tokenizer_process import TokenizerProcess
from kvscope.probe.tokens import ChatTokenizer
from kvscope.probe.wire import CallContext, RunInfo
from kvscope.records.base import ArrowWriter, JsonlWriter, compact
from kvscope.records.invocations import INVOCATIONS_JSONL, InvocationError
from kvscope.records.payloads import PAYLOADS_JSONL, CallPayload
from kvscope.records.prompt_columns import PROMPT_COLUMNS_JSONL, PromptColumns
from kvscope.records.requests import REQUESTS_JSONL, RequestRecord
from kvscope.records.tokens import TOKENS_ARROW, TOKENS_SCHEMA, PromptTokenIds
from kvscope.records.tools import TOOLS_JSONL, ToolCall

# JSON lines
STREAMS = (REQUESTS_JSONL, TOOLS_JSONL, PAYLOADS_JSONL, PROMPT_COLUMNS_JSONL, INVOCATIONS_JSONL)
Writer = JsonlWriter[Any] | ArrowWriter[Any]


class CallStreams:
    def __init__(self, run_dir: Path, *, tokens: bool, payloads: bool, part: str = "") -> None:
        """`tokens`: whether calls can have prompt token ids (a tokenizer, or an engine that
        returns them): then prompt_tokens.arrow is written. `part`: "" for the session's own
        streams, `.<pid>` for a part file of another process."""
        self.run_dir, self.has_tokens, self.has_payloads = run_dir, tokens, payloads
        self.on_row: Callable[[RequestRecord], None] = lambda _: None
        self.write_error: WriteError | None = None  # the first file the disk refused
        self.background = Background()
        self._pid = os.getpid()  # a forked process ends its calls on its own thread (`defer`)
        self.tokenizer_process: TokenizerProcess | None = None  # set by context()
        self._open(part)

    def _open(self, part: str) -> None:
        run_dir, self.part = self.run_dir, part
        self.requests: JsonlWriter[RequestRecord] = JsonlWriter(run_dir / (REQUESTS_JSONL + part))
        self.tools: JsonlWriter[ToolCall] = JsonlWriter(run_dir / (TOOLS_JSONL + part))
        self.invocations: JsonlWriter[InvocationError] = JsonlWriter(
            run_dir / (INVOCATIONS_JSONL + part)
        )
        self.tokens: ArrowWriter[PromptTokenIds] | None = (
            token_writer(run_dir / (TOKENS_ARROW + part)) if self.has_tokens else None
        )
        self.prompt_columns: JsonlWriter[PromptColumns] | None = (
            JsonlWriter(run_dir / (PROMPT_COLUMNS_JSONL + part)) if self.has_tokens else None
        )
        self.payloads: JsonlWriter[CallPayload] | None = (
            JsonlWriter(run_dir / (PAYLOADS_JSONL + part)) if self.has_payloads else None
        )

    def reopen(self, part: str) -> None:
        """Write to other part files from now on (a forked process: its own pid's)."""
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
        if chat is not None and chat.model_dir is not None and self.has_tokens:
            self.tokenizer_process = TokenizerProcess(
                chat.model_dir, self.run_dir, store_prompts, chat.trailing_assistant_as_user
            )
        return CallContext(
            **run.to_dict(),
            sink=self.row,
            instrument=PromptInstrument(
                chat,
                self.token if self.has_tokens else None,
                store_prompts,
                worker=self.background,
                columns_sink=self.columns,
                process=self.tokenizer_process,
            ),
            payload_sink=self.payload if self.has_payloads else None,
            hints=make_hints(hints),
            defer=self.defer,
        )

    def defer(self, job: Callable[[], None]) -> bool:
        """Take a call's end (CallContext.defer) to the background thread; False (the caller
        runs it): the app's own MLflow span is active on the caller's thread, the queue is full
        or closed, or this is a forked process (a multiprocessing worker ends with os._exit:
        what its thread still held would be lost)."""
        return os.getpid() == self._pid and not app_spans.active() and self.background.submit(job)

    def row(self, record: RequestRecord) -> None:
        record = app_spans.annotate(record)
        self._append(self.requests, record)
        self.on_row(record)

    def token(self, ids: PromptTokenIds) -> None:
        if self.tokens is not None:
            self._append(self.tokens, ids)

    def columns(self, record: PromptColumns) -> None:
        if self.prompt_columns is not None:
            self._append(self.prompt_columns, record)

    def invocation_error(self, error: InvocationError) -> None:
        """A graph invocation that raised (its trace's root: status ERROR)."""
        self._append(self.invocations, error)

    def tool(self, call: ToolCall) -> None:
        self._append(self.tools, call if self.has_payloads else call.without_text())

    def payload(self, payload: CallPayload) -> None:
        if self.payloads is not None:
            self._append(self.payloads, payload)

    def _append(self, writer: Writer, record: Any) -> None:
        """Append; the first WriteError (a full disk) is kept in `write_error` and raised."""
        try:
            writer.append(record)
        except WriteError as err:
            self.write_error = self.write_error or err
            raise

    def writers(self) -> list[Writer]:
        writers = (self.requests, self.tools, self.invocations, self.tokens, self.prompt_columns,
                   self.payloads)  # fmt: skip
        return [w for w in writers if w]

    def close(self) -> None:
        """Run the tokenizer's queue, close the writers; the session's own streams also take in
        other processes' parts."""
        self.background.close()
        if self.tokenizer_process is not None:
            self.tokenizer_process.close()  # its part files written: merged below
        for writer in self.writers():
            writer.close()
        if not self.part:
            merge_parts(self.run_dir)


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
