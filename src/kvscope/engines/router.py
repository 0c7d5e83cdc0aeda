"""The router in front of several engine replicas: find it, launch it, wait for it, stop it.

One module per router program holds its flags and what was seen of it on a real run:
engines.vllm_router (vllm-router 0.1.17) and engines.sglang_router (sglang-router 0.3.2);
`launch` dispatches on `deployment.router.kind`. The program is `deployment.router.executable`,
else the one next to kvscope's Python (its console script, installed by the kind's extra), else
the one on PATH.

Health: the kind's HEALTH_PATH answers 200, then, for a router that registers its workers in
the background (sglang-router), its WORKERS_PATH lists every replica healthy; all within
`startup_timeout_s`. Start and stop go through ServerProcess: its own process group, killed
with kvscope (PR_SET_PDEATHSIG), SIGTERM then SIGKILL, so no orphan.
"""

import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from kvscope.config import RouterConfig
from kvscope.engines import router_flags, sglang_router, vllm_router
from kvscope.engines.base import Launch
from kvscope.engines.process import ServerProcess, require_free_port, tail
from kvscope.engines.router_flags import Replica
from kvscope.errors import ConfigError, EngineError, EngineNotInstalled, EngineStartError


class RouterProgram(Protocol):
    """What each router's module gives (engines.vllm_router, engines.sglang_router)."""

    PACKAGE: str
    VERSION: str
    PROGRAM: str
    INSTALL: str
    HEALTH_PATH: str
    WORKERS_PATH: str | None
    DROPPED_FIELDS: frozenset[str]  # request body fields the router does not pass on

    def arguments(
        self,
        config: RouterConfig,
        replicas: Sequence[Replica],
        block_size: int | None,
        model: str | None,
    ) -> list[str]: ...

    def registered(self, listing: Any, urls: Sequence[str]) -> bool: ...


PROGRAMS: dict[str, RouterProgram] = {
    "vllm-router": vllm_router,
    "sglang-router": sglang_router,
}


def program_of(config: RouterConfig) -> RouterProgram:
    return PROGRAMS[config.kind]


def executable(config: RouterConfig) -> str:
    """The router program: configured, else next to kvscope's Python, else on PATH."""
    if config.executable:
        return config.executable
    kind = program_of(config)
    beside = Path(sys.executable).parent / kind.PROGRAM
    if beside.exists():
        return str(beside)
    found = shutil.which(kind.PROGRAM)
    if found is None:
        raise EngineNotInstalled(
            f"{kind.PROGRAM} is not installed: {kind.INSTALL} (or pip install "
            f"{kind.PACKAGE}=={kind.VERSION}), or set deployment.router.executable"
        )
    return found


def base_url(config: RouterConfig) -> str:
    return (config.url or f"http://{config.host}:{config.port}").rstrip("/")


def metrics_url(config: RouterConfig) -> str:
    return config.metrics_url or f"http://{config.host}:{config.metrics_port}/metrics"


def launch(
    config: RouterConfig,
    replicas: Sequence[Replica],
    *,
    block_size: int | None = None,
    model: str | None = None,
    program: str | None = None,
) -> Launch:
    """The exact command that starts the router of `config.kind` in front of `replicas`
    (`program`: the router executable, default `executable(config)`); extra_args last."""
    if config.url:
        raise ConfigError("deployment.router.url: an attached router is not launched")
    if not replicas:
        raise ConfigError("a router needs at least one replica")
    flags = program_of(config).arguments(config, replicas, block_size, model)
    flags += router_flags.cache_aware(config)
    return Launch((program or executable(config), *flags, *config.extra_args))


@dataclass
class RunningRouter:
    config: RouterConfig
    base_url: str
    metrics_url: str
    launch: Launch | None  # None: attached to a router kvscope did not start
    process: ServerProcess | None
    startup_s: float | None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def start(
    config: RouterConfig,
    command: Launch | None,
    log_path: Path,
    worker_urls: Sequence[str] = (),
) -> RunningRouter:
    """Start the router (`command`, from `launch`) and wait until it is healthy with every one
    of `worker_urls` registered; None: attach to config.url. On any failure, Ctrl-C included, a
    started router is stopped before raising."""
    kind = program_of(config)
    url, metrics = base_url(config), metrics_url(config)
    if command is None:
        try:
            httpx.get(url + kind.HEALTH_PATH, timeout=10).raise_for_status()
        except httpx.HTTPError as err:
            raise EngineError(
                f"cannot reach the router at {url}{kind.HEALTH_PATH}: {err}"
            ) from None
        return RunningRouter(config, url, metrics, None, None, None)
    require_free_port(config.host, config.port, "router HTTP")
    require_free_port(config.host, config.metrics_port, "router metrics")
    proc = ServerProcess(command.argv, dict(command.env), log_path)
    proc.start()
    try:
        waited = proc.wait_healthy(url + kind.HEALTH_PATH, config.startup_timeout_s, kind.PROGRAM)
        if kind.WORKERS_PATH and worker_urls:
            waited += _wait_registered(
                proc, kind, url + kind.WORKERS_PATH, worker_urls, config.startup_timeout_s - waited
            )
    except BaseException:
        proc.stop()
        raise
    return RunningRouter(config, url, metrics, command, proc, waited)


def _wait_registered(
    proc: ServerProcess, kind: RouterProgram, url: str, workers: Sequence[str], timeout_s: float
) -> float:
    """Poll the router's worker list until every one of `workers` is in it, healthy."""
    start = time.monotonic()
    listing: Any = None
    with httpx.Client(timeout=2.0) as client:
        while True:
            code = proc.exit_code()
            if code is not None:
                raise EngineStartError(
                    f"{kind.PROGRAM} exited with code {code} before registering its workers "
                    f"(full log: {proc.log_path})",
                    tail(proc.log_path),
                )
            try:
                listing = client.get(url).json()
            except (httpx.HTTPError, ValueError):
                listing = None
            if kind.registered(listing, workers):
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                raise EngineStartError(
                    f"{kind.PROGRAM} did not register every replica ({', '.join(workers)}) "
                    f"within the startup timeout; its {url} said: {str(listing)[:300]} "
                    f"(full log: {proc.log_path})",
                    tail(proc.log_path),
                )
            time.sleep(0.5)
