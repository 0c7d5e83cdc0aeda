"""Prompt tokenization in a process of its own: the app's process only hands each prompt over.

    proc = TokenizerProcess(model_dir, run_dir, store_prompts, trailing_as_user)
    proc.send(request_uuid, body, fixed_messages, prompt_tokens)   # False: not sent (dead)
    proc.close()              # end of input; waits until the process wrote all it was sent

Rendering a chat template is pure Python (jinja2): on a thread of the app's process it holds the
GIL ~0.1-0.3 ms a call, time the app's event loop waits. Here the tokenizer thread
(probe/background.py) only packs the call (msgpack) and writes it to this process's stdin; the
process (`python -m kvscope.probe.tokenizer_serve MODEL_DIR RUN_DIR STORE_PROMPTS`, started at
the first call) renders, encodes and writes the call's PromptColumns (tokenized_on "process")
and token ids to part files of its own pid, `prompt_columns.jsonl.<pid>` and
`prompt_tokens.arrow.<pid>`, merged into the streams with the other parts when the session
closes (probe/streams.merge_parts).

Contract: `send` returns False when the process cannot take the call (it exited, or never
started): the caller tokenizes it itself, nothing is lost. What the process was sent and had not
written when it died is lost (its rows keep null prompt columns: not measured); `close` logs how
it ended. A fork (multiprocessing) gives the child no process: its first call starts its own.
The process does not load kvscope's probe (KVSCOPE_CAPTURE is left out of its environment).
"""

import contextlib
import logging
import os
import subprocess
import sys
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import msgpack

log = logging.getLogger(__name__)
_PIPE_BYTES = 1 << 20  # ~250 calls of 4 KiB in flight before the tokenizer thread waits
_F_SETPIPE_SZ = 1031  # Linux fcntl
SERVE = "kvscope.probe.tokenizer_serve"  # the process's module
_CAPTURE_ENV = "KVSCOPE_CAPTURE"  # probe/child.CAPTURE_ENV (child imports streams: no cycle)


class TokenizerProcess:
    def __init__(
        self, model_dir: Path, run_dir: Path, store_prompts: bool, trailing_as_user: bool = False
    ) -> None:
        self.model_dir, self.run_dir, self.store_prompts = model_dir, run_dir, store_prompts
        self.trailing_as_user = trailing_as_user  # ChatTokenizer.trailing_assistant_as_user
        self.sent = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dead = False
        _LIVE.add(self)

    def send(
        self,
        request_uuid: str,
        body: Mapping[str, Any],
        fixed_messages: int | None,
        prompt_tokens: int | None,
    ) -> bool:
        """Hand one call over (blocks while the pipe is full); False: the caller tokenizes it."""
        if self._dead:
            return False
        try:
            frame = msgpack.packb([request_uuid, fixed_messages, prompt_tokens, body])
        except (TypeError, ValueError, OverflowError):  # not msgpack: an int over 64 bits...
            return False
        try:
            stdin = self._stdin()
            stdin.write(frame)
            stdin.flush()
        except OSError:  # BrokenPipeError: it exited
            self._dead = True
            log.warning("kvscope: the tokenizer process ended; prompts are tokenized in-process")
            return False
        self.sent += 1
        return True

    def _stdin(self) -> IO[bytes]:
        if self._proc is None:
            env = {k: v for k, v in os.environ.items() if k != _CAPTURE_ENV}  # no probe there
            argv = [sys.executable, "-m", SERVE, str(self.model_dir), str(self.run_dir),
                    "1" if self.store_prompts else "0",
                    "1" if self.trailing_as_user else "0"]  # fmt: skip
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env)
            assert self._proc.stdin is not None
            # a larger pipe where Linux allows: else the thread waits sooner, nothing else changes
            with contextlib.suppress(ImportError, OSError):
                import fcntl

                fcntl.fcntl(self._proc.stdin.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
        assert self._proc.stdin is not None
        return self._proc.stdin

    def close(self) -> None:
        """End of input; wait until the process wrote what it was sent (idempotent)."""
        proc, self._proc, self._dead = self._proc, None, True
        if proc is None:
            return
        with contextlib.suppress(OSError, AssertionError):
            assert proc.stdin is not None
            proc.stdin.close()
        code = proc.wait()
        if code != 0:
            log.warning("kvscope: the tokenizer process exited with %d (%d calls sent); calls "
                        "it had not written keep no prompt ids", code, self.sent)  # fmt: skip

    def _forget(self) -> None:
        """In a forked child: the parent's process is not this one's (its pipe closed here)."""
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                os.close(self._proc.stdin.fileno())
        self._proc, self._dead, self.sent = None, False, 0


_LIVE: "weakref.WeakSet[TokenizerProcess]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for proc in list(_LIVE):
        proc._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
