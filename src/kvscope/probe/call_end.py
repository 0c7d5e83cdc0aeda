"""How an intercepted call ends, whichever way the app's reading of it goes: the one definition
that kvscope's own call (probe/wire.InFlight) and the lite probe's (probe/raw_call.RawCall) share.
Standard library only (the lite probe runs where kvscope's dependencies are not installed).
"""

from collections.abc import Iterator
from contextlib import contextmanager


class CallEnd:
    """A call that ends once: `finish(early=...)` at its end, `fail(err)` when it raised (both
    defined by the call; a second end is ignored by the call)."""

    def finish(self, *, early: bool = False) -> None:
        raise NotImplementedError

    def fail(self, err: BaseException) -> None:
        raise NotImplementedError

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Around the app's reading of the reply: its end, the app leaving early, or a failure
        ends the call."""
        try:
            yield
        except GeneratorExit:
            self.finish(early=True)
            raise
        except BaseException as err:
            self.fail(err)
            raise
        self.finish()

    @contextmanager
    def sending(self) -> Iterator[None]:
        """Around sending the request: a failure before the reply (connection, timeout) ends the
        call."""
        try:
            yield
        except BaseException as err:
            self.fail(err)
            raise

    @contextmanager
    def closing(self) -> Iterator[None]:
        """Around closing the reply: closed before its end, the call ends there."""
        try:
            yield
        finally:
            self.finish(early=True)
