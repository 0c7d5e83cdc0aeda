"""The reply's byte stream as the app reads it, read through its call (probe/intercept.py).

`observed(lib, stream, call)` is what an intercepted response's `stream` becomes: the app reads
`call.feed(chunk)` for every chunk of the engine's reply and `call.flush()` at its end, and the
call ends where the app's reading ends (`CallEnd.read_stopped`) or where the app closes the
response first (`finish(early=True)`).

An observed stream shows the `elapsed` of the stream it wraps: httpx2's response reads its
`elapsed` there once closed (httpx's bound stream sets it on the response itself).

It yields no empty chunk, at its end nor when read again once read to its end: the OpenAI SDK
reads a streamed response's `stream` again after `[DONE]` to drain it (HTTP/1.1), awaiting an
anyio checkpoint for each chunk it finds there, and an empty one cost every call of the app one
more turn of its event loop (behind every ready task: under load, +30-40% call latency).

Reading below httpx's own stream wrappers instead (the connection's stream, under httpx's
exception map: two generators fewer a read of the app) was measured and not kept: the app's
garbage collection rate under load and its loop time a call did not change (README, issue 32).

Standard library only: this also runs in an app's interpreter where kvscope is not installed.
"""

import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any, Protocol


class Reading(Protocol):
    """What the stream needs of its call (probe/intercept.Call)."""

    def feed(self, chunk: bytes, now: float) -> bytes: ...
    def flush(self, now: float) -> bytes: ...
    def finish(self, *, early: bool = False) -> None: ...
    def read_stopped(self, err: BaseException | None) -> None: ...


_CLASSES: dict[Any, type] = {}


def observed(lib: Any, stream: Any, call: Reading) -> Any:
    """`stream`, a byte stream of `lib` (httpx or httpx2), read through `call`."""
    cls = _CLASSES.get(lib)
    if cls is None:
        cls = _CLASSES[lib] = _stream_class(lib)
    return cls(stream, call)


def _stream_class(lib: Any) -> type:
    class Observed(lib.SyncByteStream, lib.AsyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(self, inner: Any, call: Reading) -> None:
            self.inner, self.call = inner, call

        @property
        def elapsed(self) -> Any:
            """The wrapped stream's (httpx2's Response.elapsed reads it from its stream)."""
            return getattr(self.inner, "elapsed", None)

        def __iter__(self) -> Iterator[bytes]:
            call, stream = self.call, iter(self.inner)
            try:
                for chunk in stream:
                    yield call.feed(chunk, time.perf_counter())
                if tail := call.flush(time.perf_counter()):
                    yield tail
            except BaseException as err:
                call.read_stopped(err)
                raise
            finally:  # as httpx's own streams do (the async one: see below)
                if isinstance(stream, Generator):
                    stream.close()
            call.read_stopped(None)

        async def __aiter__(self) -> AsyncIterator[bytes]:
            call, stream = self.call, self.inner.__aiter__()
            try:
                async for chunk in stream:
                    yield call.feed(chunk, time.perf_counter())
                if tail := call.flush(time.perf_counter()):
                    yield tail  # no empty chunk: see the module doc
            except BaseException as err:
                call.read_stopped(err)
                raise
            finally:  # as httpx's own streams do: else the loop finalizes it (a self-pipe write)
                if isinstance(stream, AsyncGenerator):
                    await stream.aclose()
            call.read_stopped(None)

        def close(self) -> None:
            try:
                self.inner.close()
            finally:
                self.call.finish(early=True)  # closed before its end: it ends here

        async def aclose(self) -> None:
            try:
                await self.inner.aclose()
            finally:
                self.call.finish(early=True)  # closed before its end: it ends here

    return Observed
