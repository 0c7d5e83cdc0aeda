"""The tokenizer process's side (probe/tokenizer_process.py starts it): calls in on stdin, their
prompt columns and token ids out to part files of this process's pid.

    python -m kvscope.probe.tokenizer_serve MODEL_DIR RUN_DIR STORE_PROMPTS TRAILING_AS_USER
(the last two: 1 or 0; the fourth is ChatTokenizer.trailing_assistant_as_user, the engine's)

Each call is a msgpack array [request_uuid, fixed_messages, prompt_tokens, body]; its columns are
probe/instrument.PromptInstrument's, as the app's own process would make them. The loop ends at
the end of stdin (the app's process closed it, or exited), with both files complete; SIGINT (a
Ctrl-C of the app's process group) is ignored.
"""

import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgpack

from kvscope.probe.instrument import PromptInstrument
from kvscope.probe.tokens import ChatTokenizer
from kvscope.records.base import ArrowWriter, JsonlWriter
from kvscope.records.prompt_columns import PROCESS, PROMPT_COLUMNS_JSONL, PromptColumns
from kvscope.records.tokens import TOKENS_ARROW, TOKENS_SCHEMA, PromptTokenIds

log = logging.getLogger(__name__)


def serve(
    model_dir: Path,
    run_dir: Path,
    store_prompts: bool,
    stdin: IO[bytes],
    trailing_as_user: bool = False,
) -> int:
    """The process's loop: each call read from `stdin` -> its PromptColumns and token ids in
    this pid's part files; how many calls it read."""
    chat = ChatTokenizer.from_model_dir(model_dir, trailing_assistant_as_user=trailing_as_user)
    part = f".{os.getpid()}"
    tokens = ArrowWriter(run_dir / (TOKENS_ARROW + part), TOKENS_SCHEMA, PromptTokenIds.to_batch)
    columns: JsonlWriter[PromptColumns] = JsonlWriter(run_dir / (PROMPT_COLUMNS_JSONL + part))
    instrument = PromptInstrument(chat, tokens.append, store_prompts)
    calls = 0
    try:
        for request_uuid, fixed, prompt_tokens, body in _frames(stdin):
            calls += 1
            hints = {} if fixed is None else {"fixed_messages": fixed}
            try:
                got = instrument.columns(body, request_uuid, hints, prompt_tokens, None)
            except Exception:
                log.exception("kvscope: a prompt could not be tokenized; its row keeps no ids")
                continue
            if got:
                columns.append(PromptColumns(request_uuid, **got, tokenized_on=PROCESS))
    finally:
        tokens.close()
        columns.close()
    return calls


def _frames(stdin: IO[bytes]) -> Iterator[Any]:
    """The calls as they arrive (what the pipe holds now, not a full read buffer's worth)."""
    unpacker = msgpack.Unpacker(raw=False)
    while data := os.read(stdin.fileno(), 1 << 16):
        unpacker.feed(data)
        yield from unpacker


if __name__ == "__main__":
    # Ctrl-C reaches the app's whole process group: this process ends at the end of its input
    # instead (the app's process closing the pipe, or exiting), what it was sent written.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model, run, store, trailing = sys.argv[1:5]
    serve(Path(model), Path(run), store == "1", sys.stdin.buffer, trailing == "1")
