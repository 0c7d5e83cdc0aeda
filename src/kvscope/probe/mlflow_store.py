"""A run's MLflow store as kvscope knows it without loading MLflow: where it is, whether it
answers, what the trace audit found (`TraceAudit`; probe/tracing.py counts it).

MLflow's package brings ~110k Python objects into a process (its own modules, SQLAlchemy,
pandas): in an app profiled in its own process (`kvscope.profile()`), every full garbage
collection of the app would walk them. A capture session reads these at open and loads MLflow
only where it opens the run; publish loads it where it writes to the run.
"""

from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True)
class TraceAudit:
    """Traces expected (workflow runs) vs. traces the store holds complete for the run."""

    expected: int
    written: int
    dropped: int  # expected - written, never negative
    incomplete: int = 0  # linked to the run but with spans missing (counted in dropped)


def local_store_uri(runs_dir: Path) -> str:
    return f"sqlite:///{runs_dir.resolve() / 'mlflow.db'}"


def unreachable(uri: str, timeout_s: float = 3.0) -> str | None:
    """Why the MLflow tracking server at `uri` cannot be used now, or None. Only an HTTP(S)
    server is checked (its /health, within `timeout_s`): MLflow's own client would retry a dead
    server for minutes. A local store (sqlite:, file:, a path) always answers None."""
    if not uri.startswith(("http://", "https://")):
        return None
    try:
        reply = httpx.get(f"{uri.rstrip('/')}/health", timeout=timeout_s)
    except httpx.HTTPError as err:
        return f"MLflow at {uri} is unreachable ({type(err).__name__}: {err})".replace(" ()", "")
    if reply.status_code != 200:
        return f"MLflow at {uri} answered /health with HTTP {reply.status_code}"
    return None
