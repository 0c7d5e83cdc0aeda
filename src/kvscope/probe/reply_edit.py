"""What kvscope takes out of a reply before the app reads it, decided on the bytes as they pass.

Standard library only (the lite probe's call, probe/raw_call.py, uses it in an app's interpreter;
kvscope's own, probe/wire.py, in kvscope's). Both read the reply as the app reads it; the app
gets, per SSE event (`kept`):
- b"" for the usage-only chunk kvscope asked for (`strip`: the app did not ask for usage): a chunk
  with `"choices": []` and a usage (the only events parsed for it: a byte test finds them);
- with an engine prompt-ids edit (`without`, `candidate`: the engine's `without_ids` and
  `may_be_added` of engines/vllm_ids.py, sglang_ids.py), the event with the ids taken out, b""
  for an event only the ids field brought (parsed only where `candidate` says it may be one);
- every other event unchanged.
Parsing for the call's row (TTFT, usage, the ids) is not done here: a call keeps the events and
its row is made from them later, off the app's thread (probe/wire.InFlight).

`events(buffer)` splits complete SSE events off a buffer ("\\n\\n", "\\r\\n\\r\\n" or mixed ends);
`whole(buffer)` cuts off the whole events at its head as one run. `kept_run(run)` edits a run of
whole events (what one network read completed) at once where nothing in it can be dropped and
the engine's edit takes several events at once (`runs`), else event by event: the same bytes.
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

from kvscope.probe.json_body import loads

EVENT_END = re.compile(rb"\n\r?\n")  # the end of an SSE event (a "\r" before it is the event's)
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')  # unescaped quotes: never inside a string
Without = Callable[[bytes, Mapping[str, Any] | None], bytes | None]


def events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The complete events at the head of `buffer`, and the rest (an event not ended yet)."""
    out, start = [], 0
    for end in EVENT_END.finditer(buffer):
        out.append(buffer[start : end.end()])
        start = end.end()
    return out, buffer[start:]


def whole(buffer: bytes) -> tuple[bytes, bytes]:
    """(the whole events at the head of `buffer` as one run, b"" if none has ended yet; the
    rest: an event not ended yet)."""
    lf, crlf = buffer.rfind(b"\n\n"), buffer.rfind(b"\n\r\n")
    end = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
    return buffer[:end], buffer[end:]


def data_of(event: bytes) -> bytes:
    """An SSE event's data (its `data:` lines joined by newlines)."""
    body = event.rstrip(b"\r\n")
    if body.startswith(b"data:") and b"\n" not in body:
        return body[5:].lstrip()
    return b"\n".join(line[5:].lstrip() for line in body.splitlines() if line.startswith(b"data:"))


def chunk_of(event: bytes) -> dict[str, Any] | None:
    """An SSE event's JSON object; None for [DONE], no data, or what is not a JSON object."""
    data = data_of(event)
    if not data or data.strip() == b"[DONE]":
        return None
    try:
        chunk = loads(data)
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


class ReplyEdit:
    """The edits of one streamed reply (module docstring); `active`: whether any applies (else
    the app reads the engine's bytes as they come)."""

    def __init__(
        self,
        strip: bool,
        without: Without | None,
        candidate: Callable[[bytes], bool],
        runs: bool = False,
    ) -> None:
        """`runs`: `without(run, None)` edits several whole events at once exactly as each alone
        (Engine.prompt_ids_edit_runs)."""
        self.strip, self.without, self.candidate, self.runs = strip, without, candidate, runs
        self.active = strip or without is not None

    def kept_run(self, run: bytes) -> bytes:
        """What the app gets of `run`, one or more whole events (`whole`): at once where no event
        in it may be dropped (no usage chunk to strip, none the ids alone may have brought) and
        the edit takes them together (`runs`, or a single event), else event by event."""
        dropping = (self.strip and b'"usage"' in run) or (
            self.without is not None and self.candidate(run)
        )
        if not dropping and (self.without is None or self.runs or run.count(b"data:") <= 1):
            return run if self.without is None else self.without(run, None) or b""
        done, rest = events(run)
        return b"".join([self.kept(event) for event in done]) + rest

    def kept(self, event: bytes) -> bytes:
        """What the app gets of one complete SSE event."""
        if self.strip and b'"usage"' in event and _NO_CHOICES.search(event):
            chunk = chunk_of(event)
            if chunk is not None and chunk.get("usage") and not chunk.get("choices"):
                return b""
        if self.without is None:
            return event
        chunk = chunk_of(event) if self.candidate(event) else None
        return self.without(event, chunk) or b""
