"""The router's command line and the replicas' configurations (issue 17, item 1)."""

import json

import pytest

from kvscope.config import DeploymentConfig, EngineConfig, RouterConfig, parse_experiment
from kvscope.engines import deployment, router
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import ConfigError

REPLICAS = [
    router.Replica("r0", "http://127.0.0.1:8000", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"),
    router.Replica("r1", "http://127.0.0.1:8010", "tcp://127.0.0.1:5567", "tcp://127.0.0.1:5568"),
]


def values(argv: tuple[str, ...], name: str) -> list[str]:
    """The values after `name` up to the next flag; every occurrence, flattened."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == name:
            for v in argv[i + 1 :]:
                if v.startswith("--"):
                    break
                out.append(v)
    return out


def test_round_robin_command() -> None:
    cfg = RouterConfig(policy="round_robin", port=30010, metrics_port=29010)
    argv = router.launch(cfg, REPLICAS, program="/opt/bin/vllm-router").argv
    assert argv[0] == "/opt/bin/vllm-router"
    assert values(argv, "--worker-urls") == ["http://127.0.0.1:8000", "http://127.0.0.1:8010"]
    assert values(argv, "--policy") == ["round_robin"]
    assert (values(argv, "--port"), values(argv, "--prometheus-port")) == (["30010"], ["29010"])
    assert values(argv, "--request-id-headers") == ["x-request-id"]
    assert values(argv, "--worker-startup-timeout-secs") == ["60"]  # the router's own timeout
    assert "--kv-event-source" not in argv  # only kv_aware reads KV events
    assert router.base_url(cfg) == "http://127.0.0.1:30010"
    assert router.metrics_url(cfg) == "http://127.0.0.1:29010/metrics"


def test_kv_aware_command_subscribes_to_every_replica() -> None:
    cfg = RouterConfig(policy="kv_aware", extra_args=("--router-temperature", "0.5"))
    argv = router.launch(cfg, REPLICAS, block_size=128, model="smollm2", program="vr").argv
    assert values(argv, "--kv-event-source") == [
        "http://127.0.0.1:8000=tcp://127.0.0.1:5557",
        "http://127.0.0.1:8010=tcp://127.0.0.1:5567",
    ]
    assert (
        values(argv, "--kv-event-replay-source")[1] == "http://127.0.0.1:8010=tcp://127.0.0.1:5568"
    )
    assert values(argv, "--kv-event-block-size") == ["128"]
    assert values(argv, "--kv-event-model") == ["smollm2"]
    assert argv[-2:] == ("--router-temperature", "0.5")  # extra args last


def test_kv_aware_without_events_or_block_size_is_refused() -> None:
    cfg = RouterConfig(policy="kv_aware")
    with pytest.raises(ConfigError, match="block size"):
        router.launch(cfg, REPLICAS, program="vr")
    with pytest.raises(ConfigError, match="missing events: r1"):
        router.launch(cfg, [REPLICAS[0], router.Replica("r1", "http://x:1")], block_size=16,
                      program="vr")  # fmt: skip


def test_only_vllm_router_is_launched() -> None:
    with pytest.raises(ConfigError, match="vllm-router only"):
        router.launch(RouterConfig(kind="sglang-router", policy="round_robin"), REPLICAS)
    with pytest.raises(ConfigError, match="not launched"):
        router.launch(RouterConfig(url="http://r:1"), REPLICAS, program="vr")


def test_the_router_program_is_found_or_named(monkeypatch, tmp_path) -> None:
    assert router.executable(RouterConfig(executable="/x/vllm-router")) == "/x/vllm-router"
    monkeypatch.setattr(router.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(Exception, match=r"kvscope\[router\]"):
        router.executable(RouterConfig())
    (tmp_path / "vllm-router").write_text("")
    assert router.executable(RouterConfig()) == str(tmp_path / "vllm-router")


def test_replicas_get_their_own_ports_and_share_kv_events() -> None:
    d = DeploymentConfig(replicas=3, port_stride=10)
    engines = deployment.replica_engines(d, EngineConfig(port=8000, kv_events_port=5557))
    assert [e.config.port for e in engines] == [8000, 8010, 8020]
    assert [e.config.kv_events_port for e in engines] == [5557, 5567, 5577]
    second = engines[1]
    assert isinstance(second, VllmEngine) and second.shared_kv_events
    ep = second.endpoints()
    # the publisher binds (two subscribers: kvscope and a kv_aware router), kvscope connects
    assert (ep.kv_events, ep.kv_events_subscriber_binds) == ("tcp://127.0.0.1:5567", False)
    argv = second.launch().argv
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert (events["endpoint"], events["replay_endpoint"]) == (
        "tcp://*:5567",
        "tcp://127.0.0.1:5568",
    )
    assert argv.count("--enable-log-requests") == 1  # the replica's log names its requests
    replicas = deployment.router_replicas(d, engines)
    assert [(r.name, r.base_url) for r in replicas][2] == ("r2", "http://127.0.0.1:8020")
    assert deployment.block_size(second) == 128


def test_a_single_engine_keeps_its_own_kv_events_socket() -> None:
    engine = VllmEngine(EngineConfig())
    assert engine.endpoints().kv_events_subscriber_binds is True  # unchanged outside a deployment
    assert "--enable-log-requests" not in engine.launch().argv


def test_attached_replicas_are_named_by_url() -> None:
    cfg = parse_experiment(
        {
            "engine": {"kind": "attach", "url": "http://h:30000"},
            "deployment": {
                "router": {"url": "http://h:30000"},
                "replica_urls": ["http://a:8000", "http://b:8000"],
                "kv_events_endpoints": ["tcp://a:5557", "tcp://b:5557"],
            },
        }
    )
    assert cfg.deployment is not None
    configs = deployment.replica_configs(cfg.deployment, cfg.engine)
    assert [(c.url, c.kv_events_endpoint) for c in configs] == [
        ("http://a:8000", "tcp://a:5557"),
        ("http://b:8000", "tcp://b:5557"),
    ]


def test_launch_commands_are_recorded() -> None:
    running = deployment.RunningDeployment(DeploymentConfig(replicas=1))
    assert running.launch_commands() == {}
    running.stop()  # nothing started: nothing to stop, no error
    cfg = RouterConfig(policy="round_robin")
    command = router.launch(cfg, REPLICAS[:1], program="vllm-router")
    running.router = router.RunningRouter(cfg, "u", "m", command, None, None)
    assert running.launch_commands() == {"router": command.shell()}
    assert running.launch_commands()["router"].startswith("vllm-router --host 127.0.0.1")
    running.stop()  # attached: nothing of ours to stop
