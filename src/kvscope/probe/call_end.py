"""How an intercepted call ends, whichever way the app's reading of it goes: the one definition
that kvscope's own call (probe/wire.InFlight) and the lite probe's (probe/raw_call.RawCall) share.
Standard library only (the lite probe runs where kvscope's dependencies are not installed).

Plain methods the interceptor calls from its own `try` blocks (probe/intercept.py), not context
managers: a call holds no generator while it is in flight (the garbage collector's young
generations see fewer objects per call under load).
"""


class CallEnd:
    """A call that ends once: `finish(early=...)` at its end (early: the reply closed before
    it), `fail(err)` when it raised, sending included (both defined by the call; a second end is
    ignored by the call)."""

    def finish(self, *, early: bool = False) -> None:
        raise NotImplementedError

    def fail(self, err: BaseException) -> None:
        raise NotImplementedError

    def read_stopped(self, err: BaseException | None) -> None:
        """The app's reading of the reply stopped: at its end (`err` None), the app leaving
        early (GeneratorExit) or by a failure; each ends the call."""
        if err is None:
            self.finish()
        elif isinstance(err, GeneratorExit):
            self.finish(early=True)
        else:
            self.fail(err)
