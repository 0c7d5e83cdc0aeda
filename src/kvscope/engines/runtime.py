"""Start an engine, wait until it is healthy, and always stop it: also on Ctrl-C and errors."""

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kvscope.engines import auth, state
from kvscope.engines.base import Endpoints, Engine, Launch
from kvscope.engines.process import ServerProcess
from kvscope.errors import EngineError


@dataclass
class RunningEngine:
    engine: Engine
    endpoints: Endpoints
    launch: Launch | None  # None: attached to a server kvscope did not start
    process: ServerProcess | None  # None: attached, or reused from `kvscope engine up`
    startup_s: float | None
    reused_pid: int | None = None
    shared_log: Path | None = None  # the log of an engine that `kvscope engine up` started

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def start(engine: Engine, log_path: Path, *, detached: bool = False) -> RunningEngine:
    return start_many([(engine, log_path)], detached=detached)[0]


def start_many(
    engines: Sequence[tuple[Engine, Path]], *, detached: bool = False
) -> list[RunningEngine]:
    """Each engine healthy (or, given `url:`, reached), in order. The processes are all spawned
    before the first is waited for, so that replicas load side by side (on 2 cores two engines
    were healthy in about the time of one); on any failure, or Ctrl-C, every one is stopped."""
    spawned: list[tuple[Engine, Endpoints, Launch | None, ServerProcess | None]] = []
    try:
        for engine, log_path in engines:
            engine.preflight()
            endpoints, launch = engine.endpoints(), engine.launch()
            if launch is None:
                _reach(engine, endpoints)
                spawned.append((engine, endpoints, None, None))
                continue
            proc = ServerProcess(launch.argv, dict(launch.env), log_path, detached=detached)
            spawned.append((engine, endpoints, launch, proc))
            proc.start()
        out = []
        for engine, endpoints, launch, proc in spawned:
            waited = None
            if proc is not None:
                health = f"{endpoints.base_url}{engine.health_path}"
                waited = proc.wait_healthy(health, engine.config.startup_timeout_s, engine.name)
            out.append(RunningEngine(engine, endpoints, launch, proc, waited))
        return out
    except BaseException:
        for *_, proc in spawned:
            if proc is not None:
                proc.stop()
        raise


def _reach(engine: Engine, endpoints: Endpoints) -> None:
    health = f"{endpoints.base_url}{engine.health_path}"
    try:
        keyed = auth.headers(engine.config.api_key_env)
        httpx.get(health, timeout=10, headers=keyed).raise_for_status()
    except httpx.HTTPError as err:
        raise EngineError(f"cannot reach the engine at {health}: {err}") from None


def state_of(
    handle: RunningEngine, log_path: Path, capabilities: dict[str, Any] | None = None
) -> state.EngineState:
    """What `kvscope engine up` records of a started engine, so that later commands find it."""
    proc = handle.process
    return state.EngineState(
        kind=handle.engine.name,
        pid=proc.pid if proc else None,
        descendants=tuple(proc.descendants()) if proc else (),
        endpoints=handle.endpoints,
        launch_command=handle.launch.shell() if handle.launch else None,
        log_path=str(log_path) if proc else None,
        startup_s=handle.startup_s,
        config=handle.engine.config.model_dump(mode="json"),
        capabilities=capabilities,
        dtype=handle.engine.dtype_choice().as_dict() if handle.launch else None,
    )


def reusable(engine: Engine) -> RunningEngine | None:
    """The engine `kvscope engine up` left running, if its configuration is this one."""
    st = state.load()
    if st is None or not st.alive():
        return None
    mine = engine.config.model_dump(mode="json", exclude={"startup_timeout_s"})
    theirs = {k: v for k, v in st.config.items() if k != "startup_timeout_s"}
    if st.kind != engine.name or mine != theirs:
        return None
    handle = RunningEngine(engine, st.endpoints, engine.launch(), None, None, reused_pid=st.pid)
    handle.shared_log = Path(st.log_path) if st.log_path else None
    return handle


@contextmanager
def running(engine: Engine, log_path: Path, *, reuse: bool = True) -> Iterator[RunningEngine]:
    """A healthy engine for the duration of the block; stopped after it unless reused."""
    handle = reusable(engine) if reuse else None
    if handle is None:
        handle = start(engine, log_path)
    log = handle.shared_log
    offset = log.stat().st_size if log is not None and log.exists() else 0
    try:
        yield handle
    finally:
        handle.stop()
        if log is not None and log.exists():
            _excerpt(log, offset, log_path)


def _excerpt(log: Path, offset: int, target: Path) -> None:
    """What a shared engine logged during this block, into the run's own engine.log."""
    with log.open("rb") as src, target.open("wb") as out:
        out.write(
            f"# {log}, from byte {offset}: the engine was started by `kvscope engine up`\n".encode()
        )
        src.seek(offset)
        out.write(src.read())


def reset_cache(engine: Engine, base_url: str, attempts: int = 20) -> str | None:
    """Empty the engine's prefix cache so that a run starts cold; a note when it cannot."""
    path = engine.cache_reset_path
    if path is None:
        return f"prefix cache not reset ({engine.name}: no known reset endpoint)"
    url, last = f"{base_url}{path}", ""
    for _ in range(attempts):  # refused while blocks are still held: retry
        try:
            reply = httpx.post(url, timeout=30, headers=auth.headers(engine.config.api_key_env))
            if reply.status_code == 200 and engine.cache_reset_ok(reply):
                return None
            if reply.status_code in (404, 405):  # no such route (vLLM without dev mode): final
                why = f"{url} answers {reply.status_code}: no reset endpoint on this server"
                raise EngineError(f"could not empty the prefix cache: {why}")
            last = f"HTTP {reply.status_code} {reply.text[:200]}"
        except httpx.HTTPError as err:
            last = str(err)
        time.sleep(0.5)
    raise EngineError(f"could not empty the prefix cache ({url}): {last}")
