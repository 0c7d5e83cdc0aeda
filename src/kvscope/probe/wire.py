"""One intercepted call on the wire: the request as sent, the reply as the app reads it, its row.

What changes on the wire, and what the app sees of it:

- the engine tags (`Engine.request_tags`: the request id as vLLM `request_id` / SGLang `rid`,
  `session_id`, SGLang's agent label header) are added to the JSON body and headers; a field or
  header the app set itself is left as the app set it (its value then reaches the engine instead
  of kvscope's, and joins by request_uuid may miss that row). No label header for a call with no
  agent. The body is re-serialized (same JSON, possibly other whitespace).
- a streamed call without `stream_options.include_usage: true` gets it, and the usage-only chunk
  (no choices) that it brings is removed from the stream before the app reads it: the app reads
  the engine's other bytes unchanged, re-chunked at event boundaries. A stream the app asked usage
  for is passed through byte for byte.
- where the engine can return the prompt's exact token ids (`Engine.prompt_ids_fields`: vLLM's
  `return_token_ids`, SGLang's `return_input_ids_in_sglext`) and the app did not set that field
  itself, it is added, and what it brings is taken out of the reply before the app reads it
  (`Engine.without_prompt_ids`): in a stream, only the events that carried ids are edited (back
  to what the engine sends without the flag: vLLM's id lists to `null`, SGLang's `sglext` member
  cut out) and the events only the flag brings are dropped, re-chunked at event
  boundaries as above; a non-streamed body is held to its end and handed over edited the same
  way (its Content-Length header still gives the engine's length). An app that set the field
  itself reads the engine's bytes unchanged; the ids are read either way.
- nothing else: other non-streamed replies and error replies reach the app as the engine sent
  them.

A Responses API call (/v1/responses, `responses=True`) gets the engine tags and priority only
(SGLang's `rid` sent as `request_id`: SGLang 0.5.23's ResponsesRequest ignores `rid` and takes
its rid from `request_id`, as vLLM 0.32.0's does; both then answer with it as the response id):
no `stream_options` (its stream always ends with the usage, in `response.completed`) and no
prompt-ids field (vLLM 0.32.0's /v1/responses has no `return_token_ids`), so the app reads the
engine's bytes unchanged, streamed or not. Its events and response are read by
`Seen.take_event` / `Seen.take_response` (probe/measure.py); its prompt columns stay null (its
`input` items are not chat messages: kvscope does not render them).

The reply is read as the app reads it (TTFT and TPOT are on the app's clock); a compressed reply
(Content-Encoding) is passed through but not parsed: its usage stays None.
"""

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from kvscope.collect.context import SERVER_TIMINGS
from kvscope.engines.base import Engine
from kvscope.probe.call_end import CallEnd
from kvscope.probe.identity import CallIdentity
from kvscope.probe.json_body import loads
from kvscope.probe.measure import Seen, dumps, failure, measured, short
from kvscope.probe.reply_edit import ReplyEdit, data_of, events, whole
from kvscope.records.payloads import CallPayload
from kvscope.records.requests import STATUS_ERROR, STATUS_OK, RequestRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    """Per-run constants that every row carries."""

    benchmark_run_id: str
    experiment_name: str
    configuration_hash: str
    workflow_type: str
    workflow_concurrency: int | None
    model_name: str  # used when the request names no model
    chat_template_name: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The Phase 7 columns of one call: from the body the app sent, its request_uuid, its hints
# (`fixed_messages`...), the reply chunk or body with the usage, the engine's prompt_tokens, and
# the prompt ids the engine returned (None: it did not). Must not raise for a body it cannot read
# (wire.py logs and drops an exception, but the row then lacks every column). probe/instrument.py's
# PromptInstrument is the one a capture session uses.
Instrument = Callable[
    [Mapping[str, Any], str, Mapping[str, Any], Mapping[str, Any] | None, int | None,
     Sequence[int] | None],
    Mapping[str, Any],
]  # fmt: skip


@dataclass(frozen=True)
class CallContext(RunInfo):
    """Per-run constants of the rows (RunInfo's), and where they go."""

    sink: Callable[[RequestRecord], None]
    # Phase 7 columns computed from the request body (the model's tokenizer, or the ids the
    # engine returned): instrument(body, request_uuid, hints, final reply chunk or body,
    # prompt_tokens, engine ids)
    instrument: Instrument | None = None
    # what the call sent and got back, for its trace span (None: not kept)
    payload_sink: Callable[[CallPayload], None] | None = None
    # the call's engine priority from the workflow (probe/hints.py); None: none is sent
    hints: Callable[[CallIdentity], int] | None = None
    # runs the end of a call (its row built, the prompt columns, the sinks) off the app's thread
    # (probe/background.py via CallStreams.defer); False: not taken, it runs on the app's thread.
    # None: every call ends on the app's thread.
    defer: Callable[[Callable[[], None]], bool] | None = None


class InFlight(CallEnd):
    """A call from its request to the end of its reply; `finish` emits its one row, once."""

    def __init__(
        self,
        ctx: CallContext,
        engine: Engine,
        body: dict[str, Any],
        ident: CallIdentity,
        responses: bool = False,
        request_uuid: str | None = None,
        clock: tuple[int, float] | None = None,
    ) -> None:
        """`responses`: a call to the Responses API (module docstring), else chat or
        completions. `request_uuid` and `clock` (its start: time_ns, perf_counter): a call
        recorded elsewhere and read back here (probe/raw_rows.py); None: a new call, now."""
        self.ctx, self.engine, self.ident, self.responses = ctx, engine, ident, responses
        self.request_uuid = request_uuid or str(uuid.uuid4())
        # agent "": a call no agent is named for (the engine then sends no agent label)
        tags, self.headers = engine.request_tags(self.request_uuid, ident.agent_id or "")
        if responses and "rid" in tags:  # SGLang's Responses API names its rid `request_id`
            tags["request_id"] = tags.pop("rid")
        if ctx.hints is not None:  # under the app's own fields, like the tags
            tags |= engine.priority_fields(ctx.hints(ident))
        self.sent = body  # the app's own body, for the trace payload
        fields = {} if responses else engine.prompt_ids_fields(body)
        added = {k: v for k, v in fields.items() if k not in body}
        self.body = {**tags, **body, **added}
        self.rewrite = bool(added)  # take what `added` brings out of the reply
        self.engine_ids: list[int] | None = None
        self.streaming = bool(body.get("stream"))
        options = body.get("stream_options") or {}
        self.strip = self.streaming and not options.get("include_usage") and not responses
        if self.strip:
            self.body["stream_options"] = {**options, "include_usage": True}
        self.seen = Seen()
        self.status_code: int | None = None
        self.sse = False
        self.parse = True
        self.edit: ReplyEdit | None = None  # set when the reply's headers say what it is
        # the reply as read (or its events) and when each piece was read: two lists, no tuple a
        # piece (a container the garbage collector would track while the call is in flight)
        self.pieces: list[bytes] = []
        self.times: list[float] = []
        self.buffer = b""  # an event not ended yet, while the stream is edited
        self.problem: tuple[str, str, str] | None = None  # (status, error_type, message)
        self.done = False
        self.ended = False  # the stream's own end arrived ([DONE])
        self.start_ns, self.t0 = clock or (time.time_ns(), time.perf_counter())

    def content(self) -> bytes:
        return dumps(self.body)

    def replied(self, status_code: int, headers: Mapping[str, str]) -> None:
        """The reply's status line and headers arrived."""
        self.status_code = status_code
        self.sse = status_code < 400 and "text/event-stream" in headers.get("content-type", "")
        self.parse = headers.get("content-encoding", "identity") in ("", "identity")
        self.strip = self.strip and self.sse and self.parse
        self.rewrite = self.rewrite and status_code < 400 and self.parse
        if self.sse and (self.strip or self.rewrite):
            engine = self.engine
            without = engine.without_prompt_ids if self.rewrite else None
            self.edit = ReplyEdit(
                self.strip, without, engine.may_be_prompt_ids_only, engine.prompt_ids_edit_runs
            )

    def feed(self, chunk: bytes, now: float) -> bytes:
        """Bytes of the reply as the app reads them -> the bytes the app gets. Only what the app
        must get edited is looked at here (probe/reply_edit.py); the rest is kept, timed, for the
        row (`_read`, where the call's end is made)."""
        if not self.parse:
            return chunk
        if self.edit is None:
            self.pieces.append(chunk)
            self.times.append(now)
            return b"" if self.rewrite else chunk  # an edited body goes to the app at its end
        run, self.buffer = whole(self.buffer + chunk)
        if not run:
            return b""
        self.pieces.append(run)  # its events are split where the row is made (`_read`)
        self.times.append(now)
        return self.edit.kept_run(run)

    def flush(self, now: float) -> bytes:
        """The end of the reply: what was held back (an unterminated last event, or the whole
        body of a non-streamed reply that kvscope edits)."""
        if not self.parse:
            return b""
        if self.edit is None:
            if self.sse or not self.rewrite:
                return b""
            body = b"".join(self.pieces)
            return self.engine.without_prompt_ids(body, None) or b""
        tail, self.buffer = self.buffer, b""
        if not tail.strip():
            return b""
        self.pieces.append(tail)
        self.times.append(now)
        return self.edit.kept(tail)

    def _read(self) -> bytes:
        """The reply read into `seen` (its events in order, each at the time it was read; where
        the engine gave them, the prompt's ids): done once, where the call's row is made. Returns
        the body of a reply that is not a stream (parsed by `_reply_problem`)."""
        if not self.sse:
            return b"".join(self.pieces)
        rest, now = b"", 0.0
        for now, piece in zip(self.times, self.pieces, strict=True):
            done, rest = events(rest + piece)
            for event in done:
                self._event(event, now)
        if rest.strip():  # an unterminated last event
            self._event(rest, now)
        return b""

    def _event(self, event: bytes, now: float) -> None:
        """Read one SSE event of the reply, read by the app at `now`."""
        data = data_of(event)
        if data.strip() == b"[DONE]":
            self.ended = True
        if not data or data.strip() == b"[DONE]":
            return
        try:
            chunk = loads(data)
            if self.responses:
                self.seen.take_event(chunk, now)
                return
            self.seen.take_chunk(chunk, now)
        except (ValueError, TypeError, AttributeError, KeyError) as err:
            self.problem = self.problem or failure(ValueError(f"{type(err).__name__}: {err}"))
            return
        if self.engine_ids is None:
            self.engine_ids = self.engine.reply_prompt_ids(chunk)

    def fail(self, err: BaseException) -> None:
        """The call raised (connection, timeout, a stream cut off): a row with its failure."""
        self.finish(failure(err))

    def finish(
        self,
        problem: tuple[str, str, str] | None = None,
        early: bool = False,
        t_end: float | None = None,
    ) -> None:
        """The call's end (`t_end`: its perf_counter, None: now): its row, once."""
        if self.done:
            return
        self.done = True
        t_end = time.perf_counter() if t_end is None else t_end
        job = partial(self._emit, t_end, problem, early)
        defer = self.ctx.defer
        if defer is None or not defer(job):
            job()

    def _emit(self, t_end: float, problem: tuple[str, str, str] | None, early: bool) -> None:
        """The reply read, the call's row and payload built and handed to the sinks (on the
        background thread where the context defers it: nothing of the call changes after
        `finish`)."""
        body = self._read()
        problem = problem or self.problem or self._reply_problem(early, body)
        record = self._record(t_end, problem)
        try:
            self.ctx.sink(record)
            if self.ctx.payload_sink is not None:
                output = self.seen.content if record.status == STATUS_OK else None
                self.ctx.payload_sink(CallPayload(self.request_uuid, self.sent, output))
        except Exception:  # the app's call is not kvscope's to break
            log.exception("kvscope: the request row could not be written")

    def _reply_problem(self, early: bool, body: bytes) -> tuple[str, str, str] | None:
        code = self.status_code
        if code is not None and code >= 400:
            return STATUS_ERROR, f"http_{code}", short(_error_message(body))
        if not self.parse:
            return None
        if not self.sse:
            try:
                reply = loads(body)
                if self.responses:
                    self.seen.take_response(reply)
                else:
                    self.seen.take_reply(reply)
                    self.engine_ids = self.engine.reply_prompt_ids(reply)
            except (ValueError, TypeError, AttributeError) as err:
                return failure(ValueError(f"{type(err).__name__}: {err}"))
        if self.seen.error is not None:
            return STATUS_ERROR, *self.seen.error
        if self.seen.usage is None and not (self.ended or self.seen.ended or not self.sse):
            why = "the app closed the stream before its end" if early else "the stream ended early"
            return STATUS_ERROR, "incomplete_stream", why
        return None  # a whole reply without usage: ok, its token counts unknown (null)

    def _record(self, t_end: float, problem: tuple[str, str, str] | None) -> RequestRecord:
        """The call's row, built once (one RequestRecord: no copy per column group); `problem`:
        its (status, error_type, error_message) when it failed."""
        ctx, ident, body = self.ctx, self.ident, self.body
        model = body.get("model")
        columns = measured(self.seen, self.t0, t_end, self.start_ns)
        if (self.sse and self.seen.first_token is None) or not self.streaming:
            columns["ttft_ms"] = None
        if not self.streaming:
            columns["tpot_ms"] = None
        timings = self.engine.server_timings(self.seen.final) or {}
        columns |= {k: v for k in SERVER_TIMINGS if (v := timings.get(k)) is not None}
        if ctx.instrument is not None and not self.responses:
            try:
                columns |= ctx.instrument(
                    self.sent, self.request_uuid, ident.hints, self.seen.final,
                    columns["prompt_tokens"], self.engine_ids,
                )  # fmt: skip
            except Exception:  # a prompt kvscope cannot render is a row without its ids
                log.exception("kvscope: could not read the prompt's token ids")
        row = dict(
            benchmark_run_id=ctx.benchmark_run_id,
            experiment_name=ctx.experiment_name,
            configuration_hash=ctx.configuration_hash,
            thread_id=ident.thread_id,
            workflow_run_id=ident.workflow_run_id,
            workflow_type=ctx.workflow_type,
            workflow_concurrency=ctx.workflow_concurrency,
            turn_id=ident.turn_id,
            agent_id=ident.agent_id,
            previous_agent_id=ident.previous_agent_id,
            graph_node=ident.graph_node,
            request_uuid=self.request_uuid,
            model_name=model if isinstance(model, str) else ctx.model_name,
            tool_ms=ident.tool_ms,
            prompt_template_version=None,
            chat_template_name=ctx.chat_template_name,
            prompt_layout=None,
            sharing_mode=None,
            engine_priority=_priority(body.get("priority")),
        )
        return RequestRecord(**(row | columns | _status(problem) | dict(ident.annotations)))


def _status(problem: tuple[str, str, str] | None) -> dict[str, Any]:
    if problem is None:
        return {"status": STATUS_OK}
    status, error_type, message = problem
    return {"status": status, "error_type": error_type, "error_message": message}


def _priority(value: Any) -> int | None:
    """The engine priority a call carried (kvscope's hint, or the app's own); None: none."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_message(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
        return str(message or body.decode(errors="replace"))
    except (ValueError, AttributeError):
        return body.decode(errors="replace") or "no body"
