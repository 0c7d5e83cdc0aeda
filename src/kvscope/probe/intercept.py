"""Every LLM call an unmodified app makes to the engine, as one request row.

    with Interceptor(engine, base_url, ctx):   # ctx: probe/wire.CallContext (constants + sink)
        app.invoke(...)                        # OpenAI SDK (sync / async, streamed or not),
                                               # LangChain's ChatOpenAI, raw httpx / httpx2

While an Interceptor is active, `send` of httpx's and httpx2's Client and AsyncClient (the OpenAI
SDK >= 3 speaks httpx2, older ones httpx; ChatOpenAI goes through the SDK) is wrapped, for every
client of the process, also ones made before. A POST to `<base_url>/v1/chat/completions`,
`<base_url>/v1/completions` or `<base_url>/v1/responses` (OpenAI's Responses API, the OpenAI
Agents SDK's default model) with a JSON body is a call: it is named (probe/identity.py), tagged
and observed (probe/wire.py; the reply as read: probe/reply_stream.py), and its row goes to
`ctx.sink` when the app has read the reply to its end, closed it, or the call raised. Calls to
anything else pass untouched. A failed call (HTTP error, connection error, timeout, stream cut
off) is a row with status and error_type, and the app gets the same exception or reply it would
have got.

Interceptors nest and may be entered from several threads; the wrap is removed when the last one
exits (and left as a pass-through if some other library wrapped `send` after kvscope). While it
is active, LangGraph's runs are tracked (probe/run_tracker.py) for identity.

What a call is, is the caller's: by default kvscope's own (probe/wire.InFlight: tagged, parsed
into its row as it is read); `make_call` gives another with the same interface, such as the
lite probe's RawCall (probe/raw_call.py: tagged and recorded as read, parsed into its row by the
profiling process). This module and what it imports need only the standard library and the
app's own HTTP client: it also runs in an app's interpreter where kvscope is not installed.
"""

import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from kvscope.probe import run_tracker
from kvscope.probe.identity import CallIdentity, identify, watch_frameworks
from kvscope.probe.json_body import loads
from kvscope.probe.reply_stream import observed
from kvscope.records.invocations import InvocationError
from kvscope.records.tools import ToolCall

if TYPE_CHECKING:
    from kvscope.engines.base import Engine
    from kvscope.probe.wire import CallContext

log = logging.getLogger(__name__)
RESPONSES_PATH = "/v1/responses"  # OpenAI's Responses API (probe/wire.py: what differs)
CALL_PATHS = ("/v1/chat/completions", "/v1/completions", RESPONSES_PATH)


class Call(Protocol):
    """One intercepted call, from its request to the end of its reply (probe/wire.InFlight)."""

    headers: dict[str, str]  # added to the request's (where the app set none of that name)

    def content(self) -> bytes: ...  # the request body sent
    def replied(self, status_code: int, headers: Any) -> None: ...
    def feed(self, chunk: bytes, now: float) -> bytes: ...  # reply bytes -> what the app gets
    def flush(self, now: float) -> bytes: ...
    def finish(self, *, early: bool = False) -> None: ...  # probe/call_end.CallEnd: its ends
    def fail(self, err: BaseException) -> None: ...
    def read_stopped(self, err: BaseException | None) -> None: ...


# body, identity, is-a-Responses-call -> the Call
MakeCall = Callable[[dict[str, Any], CallIdentity, bool], Call]


def http_libs() -> tuple[Any, ...]:
    """httpx and httpx2 (the OpenAI SDK >= 3's twin of httpx), those this interpreter has."""
    out = []
    for name in ("httpx", "httpx2"):
        try:
            out.append(importlib.import_module(name))
        except ImportError:
            continue
    return tuple(out)


class Interceptor:
    """Intercepts the calls to one engine while entered (a context manager, re-entrant)."""

    def __init__(
        self,
        engine: "Engine | None",
        base_url: str,
        ctx: "CallContext | None",
        on_tool: Callable[[ToolCall], None] | None = None,
        on_error: Callable[[InvocationError], None] | None = None,
        make_call: MakeCall | None = None,
    ) -> None:
        """`make_call`: how a call is made (the module docstring); None: kvscope's InFlight on
        `engine` and `ctx`."""
        self.engine, self.ctx, self.on_tool, self.on_error = engine, ctx, on_tool, on_error
        self.make_call = make_call or self._in_flight
        self.base = base_url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[: -len("/v1")]
        self._targets = {_endpoint(self.base + path) for path in CALL_PATHS}
        self._depth = 0

    def matches(self, request: Any) -> bool:
        """A POST to the engine's chat, completions or responses path (a loopback engine is the same
        engine under any loopback name: localhost, 127.0.0.1, [::1])."""
        if request.method != "POST":
            return False
        url = request.url
        return (url.scheme, _host(url.host), url.port or _PORTS.get(url.scheme), url.path) in (
            self._targets
        )

    def begin(self, request: Any) -> Call | None:
        """The call a request starts, or None for one that is not a JSON call body."""
        try:
            body = loads(request.content)
        except (ValueError, RuntimeError):  # RuntimeError: a streamed request body (unread)
            return None
        if not isinstance(body, dict):
            return None
        responses = request.url.path.endswith(RESPONSES_PATH)
        return self.make_call(body, identify(), responses)

    def _in_flight(self, body: dict[str, Any], ident: CallIdentity, responses: bool) -> Call:
        from kvscope.probe.wire import InFlight  # kvscope's own parsing: its dependencies

        assert self.engine is not None and self.ctx is not None
        return InFlight(self.ctx, self.engine, body, ident, responses=responses)

    def __enter__(self) -> "Interceptor":
        with _LOCK:
            if self._depth == 0:
                run_tracker.activate(self.on_tool, self.on_error)
                watch_frameworks()  # names the Agents SDK's, AutoGen's... calls once imported
                _ACTIVE.append(self)
                _install()
            self._depth += 1
        return self

    def __exit__(self, *_: object) -> None:
        with _LOCK:
            self._depth -= 1
            if self._depth == 0:
                _ACTIVE.remove(self)
                run_tracker.deactivate()
                if not _ACTIVE:
                    _uninstall()


_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0"}
_PORTS = {"http": 80, "https": 443}


def _host(host: str) -> str:
    host = host.lower()
    return "loopback" if host in _LOOPBACK or host.startswith("127.") else host


def _endpoint(url: str) -> tuple[str, str, int | None, str]:
    parts = urlsplit(url)
    return (parts.scheme, _host(parts.hostname or ""), parts.port or _PORTS.get(parts.scheme),
            parts.path)  # fmt: skip


_LOCK = threading.RLock()
_ACTIVE: list[Interceptor] = []
_ORIGINAL: dict[type, Callable[..., Any]] = {}  # client class -> its own send


def _claim(request: Any) -> Call | None:
    with _LOCK:
        owner = next((i for i in reversed(_ACTIVE) if i.matches(request)), None)
    if owner is None:
        return None
    try:
        return owner.begin(request)
    except Exception:  # never break the app's call for kvscope's sake
        log.exception("kvscope: could not intercept a call; it goes out untouched")
        return None


def _rebuilt(lib: Any, request: Any, call: Call) -> Any:
    """The request to send: the app's headers as they are (its Content-Length replaced), the
    call's own after them (where the app has none of that name), kvscope's body. Made from the
    finished headers and body stream, as httpx copies a request (its `stream=` form): not the
    app's request changed (a request sent again is tagged anew), and no defaults derived again
    (`content=` would: ~3x the CPU on the app's thread). The headers are copied from the app's
    Headers object (its entries shared, not normalized again)."""
    content = call.content()
    rebuilt = lib.Request(
        request.method,
        request.url,
        headers=request.headers,
        stream=lib.ByteStream(content),
        extensions=request.extensions,
    )
    headers = rebuilt.headers
    if "Content-Length" in headers:
        del headers["Content-Length"]
    for name, value in call.headers.items():
        if name not in headers:
            headers[name] = value
    headers["Content-Length"] = str(len(content))
    rebuilt.read()  # the body as `content` holds it (a ByteStream: read at once, as httpx does)
    return rebuilt


def _observe(lib: Any, response: Any, call: Call) -> None:
    call.replied(response.status_code, response.headers)
    try:
        content = response.content  # read already: an in-memory reply (a mock transport)
    except lib.ResponseNotRead:
        response.stream = observed(lib, response.stream, call)
        return
    now = time.perf_counter()
    seen = call.feed(content, now) + call.flush(now)
    if seen != content:
        response._content = seen  # what the app reads: without the usage chunk kvscope added
    call.finish()


def _sync_send(lib: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    def send(self: Any, request: Any, *, stream: bool = False, **kw: Any) -> Any:
        call = _claim(request)
        if call is None:
            return original(self, request, stream=stream, **kw)
        try:
            response = original(self, _rebuilt(lib, request, call), stream=True, **kw)
        except BaseException as err:
            call.fail(err)
            raise
        _observe(lib, response, call)
        if not stream:
            try:
                response.read()
            except BaseException:
                response.close()
                raise
        return response

    send.__kvscope__ = True  # type: ignore[attr-defined]
    return send


def _async_send(lib: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    async def send(self: Any, request: Any, *, stream: bool = False, **kw: Any) -> Any:
        call = _claim(request)
        if call is None:
            return await original(self, request, stream=stream, **kw)
        try:
            response = await original(self, _rebuilt(lib, request, call), stream=True, **kw)
        except BaseException as err:
            call.fail(err)
            raise
        _observe(lib, response, call)
        if not stream:
            try:
                await response.aread()
            except BaseException:
                await response.aclose()
                raise
        return response

    send.__kvscope__ = True  # type: ignore[attr-defined]
    return send


def _install() -> None:
    for lib in http_libs():
        for cls, make in ((lib.Client, _sync_send), (lib.AsyncClient, _async_send)):
            if cls in _ORIGINAL:
                continue  # still wrapped (left as a pass-through by an earlier uninstall)
            _ORIGINAL[cls] = cls.send
            cls.send = make(lib, cls.send)


def _uninstall() -> None:
    for cls, original in list(_ORIGINAL.items()):
        if getattr(cls.send, "__kvscope__", False):
            cls.send = original
            del _ORIGINAL[cls]
        # else: someone wrapped kvscope's wrapper; it stays, passing calls through
