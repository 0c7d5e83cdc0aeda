"""Errors that the CLI reports as one clear line instead of a traceback."""


class KvscopeError(Exception):
    """A failure the user can act on; `str(err)` is the whole message."""


class ConfigError(KvscopeError):
    """The configuration is invalid; raised before any engine starts."""


class WriteError(KvscopeError):
    """A run file could not be written (a full disk, a read-only directory); names the path.
    What was written before it is kept."""


class EngineError(KvscopeError):
    """An engine could not be installed, started, reached or stopped."""


class EngineNotInstalled(EngineError):
    pass


class PortInUse(EngineError):
    pass


class EngineStartError(EngineError):
    """The engine exited or never became healthy; carries the tail of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        full = message if not log_tail else f"{message}\n--- engine log (tail) ---\n{log_tail}"
        super().__init__(full)
