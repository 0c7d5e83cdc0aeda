"""One call as the lite probe keeps it (probe/lite.py): tagged and recorded as the app reads it,
parsed into its row later, by the profiling process (probe/raw_rows.py).

Standard library only: it runs in an app's interpreter where kvscope is not installed.

On the wire it does what kvscope's own call does (probe/wire.py's docstring), from a template
the profiling process made with the engine (`WireTemplate`, in the capture spec):
- the engine tags are added to the body and headers, a field or header the app set itself left as
  the app set it; `REQUEST_MARK` in a template value becomes the call's request_uuid, `AGENT_MARK`
  its agent (JSON-escaped in a header: SGLang's label header is JSON; no label where no agent);
- a streamed chat or completions call without `stream_options.include_usage` gets it, and the
  usage-only chunk it brings is taken out of the stream before the app reads it (the other events
  unchanged, re-chunked at event boundaries);
- where the run sends eviction hints (probe/hints.py) and the engine has the lever, the call's
  priority goes in `WireTemplate.priority_field` (under the app's own field of that name);
- where the engine returns the prompt's exact ids when asked, the field is added (the engine's
  own standard-library module, `WireTemplate.ids`: engines/vllm_ids.py, sglang_ids.py) and what
  it brings is taken out of the reply before the app reads it, by that module's `without_ids`
  (each event of a stream edited, a body at its end), as kvscope's own probe does.

The record (`RawCall.record`, one JSON line per call): the request_uuid, the identity
(probe/identity.CallIdentity's fields), the app's own body, the start (`start_ns`), the reply's
status and content type / encoding, every chunk of the reply as the engine sent it with its
arrival in seconds after the start (bytes as latin-1 text), the end, whether the app left early,
and the failure, by its exception's class names (probe/measure.failure_named reads them).
"""

import importlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvscope.probe.call_end import CallEnd
from kvscope.probe.identity import CallIdentity
from kvscope.probe.reply_edit import ReplyEdit, whole

log = logging.getLogger(__name__)
RAW_CALLS_JSONL = "raw_calls.jsonl"  # a process's records: part files raw_calls.jsonl.<pid>
REQUEST_MARK = "<<kvscope:request_uuid>>"
AGENT_MARK = "<<kvscope:agent>>"


@dataclass(frozen=True)
class WireTemplate:
    """The engine's tags with the marks in place: for a call with an agent and without one."""

    body: dict[str, Any]
    headers: dict[str, str]
    body_unnamed: dict[str, Any]
    headers_unnamed: dict[str, str]
    priority_field: str | None = None  # the body field of a call's priority; None: no lever
    ids: str | None = None  # the engine's prompt-ids module; None: no ids asked for

    def tags(self, request_uuid: str, agent: str | None) -> tuple[dict[str, Any], dict[str, str]]:
        body, headers = (
            (self.body, self.headers) if agent else (self.body_unnamed, self.headers_unnamed)
        )
        plain = {REQUEST_MARK: request_uuid, AGENT_MARK: agent or ""}
        escaped = {REQUEST_MARK: request_uuid, AGENT_MARK: json.dumps(agent or "")[1:-1]}
        return _filled(body, plain), _filled(headers, escaped)


def _filled(value: Any, marks: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for mark, text in marks.items():
            value = value.replace(mark, text)
        return value
    if isinstance(value, dict):
        return {k: _filled(v, marks) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, marks) for v in value]
    return value


class RawCall(CallEnd):
    """probe/intercept.Call for the lite probe: `sink` gets the record when the call ends."""

    def __init__(
        self,
        template: WireTemplate,
        body: dict[str, Any],
        ident: CallIdentity,
        responses: bool,
        sink: Callable[[dict[str, Any]], None],
        hints: Callable[[CallIdentity], int] | None = None,
    ) -> None:
        """`hints`: the run's eviction hints (probe/hints.py), None: none are sent."""
        self.request_uuid = str(uuid.uuid4())
        tags, self.headers = template.tags(self.request_uuid, ident.agent_id)
        field = template.priority_field if hints is not None else None
        if hints is not None and field is not None:
            tags[field] = hints(ident)
        if responses and "rid" in tags:  # SGLang's Responses API names its rid `request_id`
            tags["request_id"] = tags.pop("rid")
        self.sent, self.ident, self.responses, self.sink = body, ident, responses, sink
        self.edit = _module(template.ids) if template.ids and not responses else None
        fields = self.edit.request_fields(body) if self.edit is not None else {}
        added = {k: v for k, v in fields.items() if k not in body}
        self.body = {**tags, **body, **added}
        self.rewrite = bool(added)  # take what `added` brings out of the reply
        self.priority = self.body.get(field) if field is not None else None  # as sent
        self.sse = False
        options = body.get("stream_options") or {}
        self.strip = bool(body.get("stream")) and not options.get("include_usage")
        self.strip = self.strip and not responses
        if self.strip:
            self.body["stream_options"] = {**options, "include_usage": True}
        self.start_ns, self.t0 = time.time_ns(), time.perf_counter()
        self.status_code: int | None = None
        self.reply_headers: dict[str, str] = {}
        self.chunks: list[tuple[float, str]] = []
        self.reply_edit: ReplyEdit | None = None  # set when the reply's headers say a stream
        self.buffer = b""
        self.done = False

    def content(self) -> bytes:
        return json.dumps(self.body, ensure_ascii=False).encode()

    def replied(self, status_code: int, headers: Any) -> None:
        self.status_code = status_code
        self.reply_headers = {k: headers.get(k, "") for k in ("content-type", "content-encoding")}
        self.sse = status_code < 400 and "text/event-stream" in self.reply_headers["content-type"]
        plain = self.reply_headers["content-encoding"] in ("", "identity")
        self.strip = self.strip and self.sse and plain
        self.rewrite = self.rewrite and status_code < 400 and plain
        if self.sse and (self.strip or self.rewrite):
            without = self.edit.without_ids if self.rewrite and self.edit is not None else None
            candidate = self.edit.may_be_added if self.edit is not None else _never
            runs = getattr(self.edit, "EDITS_RUNS", False)
            self.reply_edit = ReplyEdit(self.strip, without, candidate, runs)

    def feed(self, chunk: bytes, now: float) -> bytes:
        self.chunks.append((now - self.t0, chunk.decode("latin-1")))
        if not (self.strip or self.rewrite):
            return chunk
        if self.reply_edit is None:  # a body edited at its end
            self.buffer += chunk
            return b""
        run, self.buffer = whole(self.buffer + chunk)
        return self.reply_edit.kept_run(run) if run else b""

    def flush(self, now: float) -> bytes:
        if not (self.strip or self.rewrite):
            return b""
        tail, self.buffer = self.buffer, b""
        if self.reply_edit is None:
            assert self.edit is not None
            return self.edit.without_ids(tail, None) or b""
        return self.reply_edit.kept(tail) if tail.strip() else b""

    def fail(self, err: BaseException) -> None:
        message = getattr(err, "message", None)
        error = {
            "types": [cls.__name__ for cls in type(err).__mro__],
            "message": str(message if isinstance(message, str) else err),
            "status_code": getattr(err, "status_code", None),
        }
        self.finish(error=error)

    def finish(self, early: bool = False, error: dict[str, Any] | None = None) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.sink(self.record(time.perf_counter() - self.t0, early, error))
        except Exception:  # the app's call is not kvscope's to break
            log.exception("kvscope: the call could not be recorded")

    def record(self, end: float, early: bool, error: dict[str, Any] | None) -> dict[str, Any]:
        ident = {f.name: getattr(self.ident, f.name) for f in fields(self.ident)}
        ident |= {"annotations": dict(self.ident.annotations), "hints": dict(self.ident.hints)}
        return {
            "request_uuid": self.request_uuid,
            "identity": ident,
            "body": self.sent,
            "priority": self.priority,
            "responses": self.responses,
            "start_ns": self.start_ns,
            "status_code": self.status_code,
            "headers": self.reply_headers,
            "chunks": self.chunks,
            "end": end,
            "early": early,
            "error": error,
        }


def _never(_: bytes) -> bool:
    return False


def _module(name: str) -> Any:
    """The engine's prompt-ids module (standard library only), loaded once."""
    return importlib.import_module(name)
