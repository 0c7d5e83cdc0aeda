"""Two embedded vLLM replicas shared by the router tests (test_router.py, test_sglang_router.py),
and a router of a test's own in front of them.

`start_pair` starts the replicas as engines.deployment.start does (deployment.replica_engines:
their own ports, KV events shared, each scheduled request logged in replicas/<name>/engine.log;
runtime.start_many: side by side); `ReplicaPair.close` stops them and asserts that every process
of theirs is gone and every port free. `router_in_front` starts a router of `config` in front of
them with the command deployment.start would run (router.launch with the replicas, the block
size and the model) and waits until it is healthy with both registered; after the block it is
stopped and its processes and ports are checked gone. The fixture that hands the pair out (one
for the consecutive tests that use it) is in conftest.py.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from kvscope.config import DeploymentConfig, EngineConfig, RouterConfig
from kvscope.engines import deployment, router, runtime
from kvscope.engines.base import Engine
from kvscope.engines.process import port_free
from kvscope.engines.vllm import VllmEngine
from kvscope.records.run_dir import ENGINE_LOG, replica_dir


@dataclass
class ReplicaPair:
    engine: EngineConfig  # replica r0's; r1's ports are port_stride above
    deployment: DeploymentConfig
    engines: list[Engine]
    handles: dict[str, runtime.RunningEngine]  # r0, r1
    log_dir: Path  # replicas/<name>/engine.log
    pids: list[int]  # the replicas' processes and their descendants (engine cores)
    ports: list[int]

    def logs(self) -> dict[str, str]:
        """Each replica's log so far (name -> text)."""
        return {
            n: (replica_dir(self.log_dir, n) / ENGINE_LOG).read_text(errors="replace")
            for n in self.handles
        }

    def close(self) -> None:
        """Stop both replicas; then none of their processes is left, none of their ports held."""
        for handle in self.handles.values():
            handle.stop()
        assert_gone(self.pids, self.ports, least=2)


def pids_of(*procs: Any) -> list[int]:
    """The processes' pids and their descendants' (None: no process)."""
    return [pid for p in procs if p for pid in (p.pid, *p.descendants())]


def assert_gone(pids: list[int], ports: list[int], least: int) -> None:
    assert len(pids) >= least
    assert [p for p in pids if psutil.pid_exists(p)] == []
    assert [p for p in ports if not port_free("127.0.0.1", p)] == []


def start_pair(base_port: int, log_dir: Path) -> ReplicaPair:
    """Two replicas on ports base_port (+5) and KV events on base_port + 10 (+5; replay +1)."""
    engine = EngineConfig(
        port=base_port, kv_events_port=base_port + 10, kv_capacity_tokens=4096,
        startup_timeout_s=400,
    )  # fmt: skip
    dep = DeploymentConfig(replicas=2, port_stride=5)
    engines = deployment.replica_engines(dep, engine, log_dir)
    logs = []
    for name in dep.replica_names():
        replica_dir(log_dir, name).mkdir(parents=True, exist_ok=True)
        logs.append(replica_dir(log_dir, name) / ENGINE_LOG)
    handles = runtime.start_many(list(zip(engines, logs, strict=True)))
    pids = pids_of(*(h.process for h in handles))
    p, kv = base_port, base_port + 10
    ports = [p, p + 5, kv, kv + 1, kv + 5, kv + 6]
    return ReplicaPair(
        engine, dep, engines, dict(zip(dep.replica_names(), handles, strict=True)), log_dir,
        pids, ports,
    )  # fmt: skip


@contextmanager
def router_in_front(
    pair: ReplicaPair, config: RouterConfig, log_path: Path
) -> Iterator[router.RunningRouter]:
    """A router of `config` in front of the pair, healthy with both registered; stopped after,
    its processes and ports checked gone."""
    first = pair.engines[0]
    model = first.served_name if isinstance(first, VllmEngine) else None
    command = router.launch(
        config, deployment.router_replicas(pair.deployment, pair.engines),
        block_size=deployment.block_size(pair.engines[0]), model=model,
    )  # fmt: skip
    urls = [e.endpoints().base_url for e in pair.engines]
    running = router.start(config, command, log_path, urls)
    pids = pids_of(running.process)
    try:
        yield running
    finally:
        running.stop()
    assert_gone(pids, [config.port, config.metrics_port], least=1)
