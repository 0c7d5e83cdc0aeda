"""What a capture session measures: one engine, or several replicas of it behind a router.

    target = open_target(cfg, engine, run_dir, stack)   # started (or attached), stopped by stack
    target.base_url                                     # where the workload's calls go
    for cache in target.caches: ...                     # one KV cache each: its collectors

One engine is one cache whose streams go to the run directory itself (name None). A deployment
(config `deployment`) is one cache per replica, streams in replicas/<name>/ under the same file
names, and the calls go to the router (engines.deployment starts the replicas, then the router,
and stops all of them). The router's own /metrics are read at the start and at the end
(`router_samples`), so its per-worker counters are kept beside the replicas' series.
"""

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kvscope.config import ExperimentConfig
from kvscope.engines import deployment
from kvscope.engines.base import Engine
from kvscope.engines.detect import fetch_metrics
from kvscope.engines.router import RunningRouter, program_of
from kvscope.engines.runtime import RunningEngine, reusable, running
from kvscope.records import run_dir as files


@dataclass(frozen=True)
class Cache:
    """One KV cache kvscope collects from: the engine (name None) or a replica (r0, r1, ...)."""

    name: str | None
    folder: Path  # where its streams go: the run directory, or replicas/<name>/
    handle: RunningEngine


@dataclass(frozen=True)
class Target:
    base_url: str  # where calls go, without /v1: the engine's, or the router's
    caches: tuple[Cache, ...]
    router: RunningRouter | None = None

    @property
    def first(self) -> RunningEngine:
        """The engine (or the first replica): what capabilities and facts are read from."""
        return self.caches[0].handle

    def launch_commands(self) -> dict[str, str | None]:
        """Each process's launch command by name (engine, r0, r1, ..., router); None: attached."""
        out = {c.name or "engine": c.handle.launch.shell() if c.handle.launch else None
               for c in self.caches}  # fmt: skip
        if self.router is not None:
            out["router"] = self.router.launch.shell() if self.router.launch else None
        return out

    def launch_text(self) -> str:
        """launch_command.txt: the engine's command; a deployment's, one per process, named."""
        commands = self.launch_commands()
        if self.router is None and len(commands) == 1:
            return (next(iter(commands.values())) or "") + "\n"
        return "".join(f"# {name}\n{cmd or '(attached)'}\n" for name, cmd in commands.items())


def opening(cfg: ExperimentConfig, engine: Engine) -> str:
    """What open_target is about to do, in a few words: starting, reusing or attaching to."""
    dep = cfg.deployment
    if dep is not None:
        return f"starting {dep.replicas} x {engine.name} + {dep.router.kind}"
    if cfg.engine.kind == "attach":
        return f"attaching to {engine.base_url}"
    if (up := reusable(engine)) is not None:
        return f"reusing the running {engine.name} (pid {up.reused_pid}, {up.endpoints.base_url})"
    return f"starting {engine.name}"


def hints_unheeded(
    cfg: ExperimentConfig, target: Target, wire: Engine, headers: dict[str, str]
) -> str | None:
    """Why the config's eviction hints change nothing on this target (a router that drops the
    field, an engine that does not evict by it), or None when they can act or there are none."""
    if cfg.eviction_hints in (None, "none"):
        return None
    if cfg.deployment is not None:
        program = program_of(cfg.deployment.router)
        if "priority" in program.DROPPED_FIELDS:
            return (
                f"{program.PROGRAM} {program.VERSION} rebuilds each call's body and drops "
                "`priority`: the replicas never see it"
            )
    return wire.priority_eviction(target.first.endpoints.base_url, headers)


def open_target(cfg: ExperimentConfig, engine: Engine, run_dir: Path, stack: ExitStack) -> Target:
    """Start (or reuse, or attach to) what the configuration serves with; `stack` stops it."""
    if cfg.deployment is None:
        handle = stack.enter_context(running(engine, run_dir / files.ENGINE_LOG))
        return Target(handle.endpoints.base_url, (Cache(None, run_dir, handle),))
    dep = stack.enter_context(deployment.running(cfg.deployment, cfg.engine, run_dir))
    assert dep.router is not None
    caches = tuple(
        Cache(name, files.replica_dir(run_dir, name), h) for name, h in dep.replicas.items()
    )
    return Target(dep.router.base_url, caches, dep.router)


def router_samples(router: RunningRouter) -> list[dict[str, Any]] | None:
    """The router's /metrics now: [{name, labels, value}], None when it has none."""
    with httpx.Client(timeout=10) as client:
        families = fetch_metrics(client, router.metrics_url)
    if families is None:
        return None
    return [
        {"name": s.name, "labels": dict(s.labels), "value": s.value}
        for f in families
        for s in f.samples
    ]
