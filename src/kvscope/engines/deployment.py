"""Several replicas of one engine behind a router (config `deployment`): start, check, stop.

`start` launches the replicas one after another (each its own ports from the deployment's
port_stride, its own log `replicas/<name>/engine.log` in the run directory, health checked),
then the router in front of them (`router.log`), and returns a RunningDeployment; attached
replicas (engine.kind attach) and an attached router (router.url) are health checked instead of
launched. Whatever fails, Ctrl-C
included, everything already started is stopped before the error propagates; `stop` stops the
router first, then every replica, each even when another's stop raised. Every process runs in
its own process group and dies with kvscope (engines.process), so none is left behind.

A launched vLLM replica publishes its KV events on a bound wildcard socket
(VllmEngine.shared_kv_events), so kvscope's listener and a kv_aware router both subscribe.
A launched SGLang replica writes its request log and request-metrics export into its own
folder (its output_dir: replicas/<name>/, not the state directory the replicas would share)
and logs the x-request-id header of each call beside its own rid (SGLANG_LOG_REQUEST_HEADERS):
behind sglang-router that header is the only name of the call that reaches it
(finalize.replicas).
"""

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.config import DeploymentConfig, EngineConfig
from kvscope.engines import make_engine, runtime
from kvscope.engines import router as launcher
from kvscope.engines.base import REQUEST_ID_HEADER, Engine
from kvscope.engines.router_flags import Replica
from kvscope.engines.vllm import BLOCK_SIZE, VllmEngine
from kvscope.records import run_dir as files

SGLANG_LOG_HEADERS = "SGLANG_LOG_REQUEST_HEADERS"  # SGLang 0.5.23: headers its request log names


def replica_configs(
    deployment: DeploymentConfig, engine: EngineConfig, run_dir: Path | None = None
) -> list[EngineConfig]:
    """One engine configuration per replica: its own ports (launched) or its URL (attached);
    a launched SGLang replica also its own output_dir in `run_dir` (sglang_replica)."""
    out = []
    for i, name in enumerate(deployment.replica_names()):
        if engine.kind == "attach":
            update: dict[str, object] = {"url": deployment.replica_urls[i]}
            if deployment.kv_events_endpoints:
                update["kv_events_endpoint"] = deployment.kv_events_endpoints[i]
        else:
            step = i * deployment.port_stride
            update = {"port": engine.port + step, "kv_events_port": engine.kv_events_port + step}
        if engine.kind == "sglang":
            folder = files.replica_dir(run_dir, name) if run_dir is not None else None
            update |= sglang_replica(engine, folder)
        out.append(EngineConfig.model_validate(engine.model_dump() | update))
    return out


def sglang_replica(engine: EngineConfig, folder: Path | None) -> dict[str, object]:
    """What an SGLang replica's configuration adds to `engine`'s: x-request-id among the headers
    its request log names (any the config names kept), and `folder` as its output_dir."""
    named = [h.strip() for h in engine.env.get(SGLANG_LOG_HEADERS, "").split(",") if h.strip()]
    headers = ",".join(dict.fromkeys([*named, REQUEST_ID_HEADER]))
    update: dict[str, object] = {"env": {**engine.env, SGLANG_LOG_HEADERS: headers}}
    if folder is not None:
        update["output_dir"] = folder
    return update


def replica_engines(
    deployment: DeploymentConfig, engine: EngineConfig, run_dir: Path | None = None
) -> list[Engine]:
    """The replicas' engines, named as deployment.replica_names(); vLLM ones share their KV
    events and log each request they schedule, SGLang ones log each call's x-request-id in
    their own folder of `run_dir` (how kvscope learns the serving replica)."""
    engines = [make_engine(c) for c in replica_configs(deployment, engine, run_dir)]
    for e in engines:
        if isinstance(e, VllmEngine):
            e.shared_kv_events = e.log_requests = True
    return engines


def router_replicas(deployment: DeploymentConfig, engines: list[Engine]) -> list[launcher.Replica]:
    out = []
    for name, e in zip(deployment.replica_names(), engines, strict=True):
        ep = e.endpoints()
        out.append(Replica(name, ep.base_url, ep.kv_events, ep.kv_events_replay))
    return out


def block_size(engine: Engine) -> int | None:
    """The block size a kv_aware router must hash with: the engine's, where kvscope knows it."""
    if isinstance(engine, VllmEngine):
        return engine.block_size
    return engine.config.page_size or (BLOCK_SIZE if engine.config.kind == "vllm" else None)


@dataclass
class RunningDeployment:
    deployment: DeploymentConfig
    replicas: dict[str, runtime.RunningEngine] = field(default_factory=dict)  # name -> replica
    router: launcher.RunningRouter | None = None

    def launch_commands(self) -> dict[str, str | None]:
        """name (r0, r1, ..., router) -> its launch command, secrets redacted; None: attached."""
        out = {n: h.launch.shell() if h.launch else None for n, h in self.replicas.items()}
        if self.router is not None:
            out["router"] = self.router.launch.shell() if self.router.launch else None
        return out

    def stop(self) -> None:
        """The router, then every replica; each is stopped even if an earlier stop raised."""
        errors: list[BaseException] = []
        if self.router is not None:
            _collect(self.router.stop, errors)
        for handle in self.replicas.values():
            _collect(handle.stop, errors)
        if errors:
            raise errors[0]


def _collect(stop: Callable[[], None], errors: list[BaseException]) -> None:
    try:
        stop()
    except Exception as err:  # the others must still be stopped
        errors.append(err)


def start(deployment: DeploymentConfig, engine: EngineConfig, run_dir: Path) -> RunningDeployment:
    """Every replica healthy (started side by side), then the router healthy; on failure all of
    it stopped. Logs go to the run directory: replicas/<name>/engine.log and router.log."""
    engines = replica_engines(deployment, engine, run_dir)
    running = RunningDeployment(deployment)
    try:
        logs = []
        for name in deployment.replica_names():
            folder = files.replica_dir(run_dir, name)
            folder.mkdir(parents=True, exist_ok=True)
            logs.append(folder / files.ENGINE_LOG)
        handles = runtime.start_many(list(zip(engines, logs, strict=True)))
        running.replicas = dict(zip(deployment.replica_names(), handles, strict=True))
        r = deployment.router
        command = None
        replicas = router_replicas(deployment, engines)
        if not r.url:
            model = engines[0].served_name if isinstance(engines[0], VllmEngine) else None
            command = launcher.launch(r, replicas, block_size=block_size(engines[0]), model=model)
        running.router = launcher.start(
            r, command, run_dir / files.ROUTER_LOG, [x.base_url for x in replicas]
        )
    except BaseException:
        with contextlib.suppress(Exception):
            running.stop()
        raise
    return running


@contextlib.contextmanager
def running(
    deployment: DeploymentConfig, engine: EngineConfig, run_dir: Path
) -> Iterator[RunningDeployment]:
    """A healthy deployment for the duration of the block; all of it stopped after."""
    handle = start(deployment, engine, run_dir)
    try:
        yield handle
    finally:
        handle.stop()
