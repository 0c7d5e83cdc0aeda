"""The router's command line and the replicas' configurations (issue 17, item 1)."""

import json

import pytest

from kvscope.config import DeploymentConfig, EngineConfig, RouterConfig, parse_experiment
from kvscope.engines import deployment, router, sglang_router
from kvscope.engines.router_flags import Replica
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import ConfigError

REPLICAS = [
    Replica("r0", "http://127.0.0.1:8000", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"),
    Replica("r1", "http://127.0.0.1:8010", "tcp://127.0.0.1:5567", "tcp://127.0.0.1:5568"),
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
        router.launch(cfg, [REPLICAS[0], Replica("r1", "http://x:1")], block_size=16,
                      program="vr")  # fmt: skip


def test_an_attached_router_is_not_launched() -> None:
    for kind in ("vllm-router", "sglang-router"):
        with pytest.raises(ConfigError, match="not launched"):
            router.launch(RouterConfig(kind=kind, url="http://r:1"), REPLICAS, program="vr")
    with pytest.raises(ConfigError, match="at least one replica"):
        router.launch(RouterConfig(kind="sglang-router"), [], program="smg")


def test_the_router_program_is_found_or_named(monkeypatch, tmp_path) -> None:
    assert router.executable(RouterConfig(executable="/x/vllm-router")) == "/x/vllm-router"
    monkeypatch.setattr(router.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(Exception, match=r"kvscope\[router\]"):
        router.executable(RouterConfig())
    (tmp_path / "vllm-router").write_text("")
    assert router.executable(RouterConfig()) == str(tmp_path / "vllm-router")
    sglang = RouterConfig(kind="sglang-router")
    with pytest.raises(Exception, match=r"kvscope\[sglang-router\].*sglang-router==0\.3\.2"):
        router.executable(sglang)  # vllm-router beside Python is not sglang-router
    (tmp_path / "sglang-router").write_text("")
    assert router.executable(sglang) == str(tmp_path / "sglang-router")


def test_sglang_router_command() -> None:
    cfg = RouterConfig(
        kind="sglang-router", policy="cache_aware", port=30020, metrics_port=29020,
        startup_timeout_s=90, extra_args=("--cache-threshold", "0.5"),
    )  # fmt: skip
    argv = router.launch(cfg, REPLICAS, block_size=128, model="smollm2", program="/v/smg").argv
    assert argv[:2] == ("/v/smg", "launch")  # the router is the CLI's `launch` subcommand
    assert values(argv, "--worker-urls") == ["http://127.0.0.1:8000", "http://127.0.0.1:8010"]
    assert values(argv, "--policy") == ["cache_aware"]
    assert (values(argv, "--host"), values(argv, "--prometheus-host")) == (
        ["127.0.0.1"],
        ["127.0.0.1"],  # both default to 0.0.0.0 in sglang-router
    )
    assert (values(argv, "--port"), values(argv, "--prometheus-port")) == (["30020"], ["29020"])
    assert values(argv, "--request-id-headers") == ["x-request-id"]
    assert values(argv, "--worker-startup-timeout-secs") == ["90"]
    assert values(argv, "--worker-startup-check-interval") == ["1"]
    assert values(argv, "--shutdown-grace-period-secs") == ["10"]  # under kvscope's 20 s grace
    assert not [a for a in argv if a.startswith("--kv-event")]  # it reads no KV events
    assert argv[-2:] == ("--cache-threshold", "0.5")
    assert router.base_url(cfg) == "http://127.0.0.1:30020"
    assert router.program_of(cfg).HEALTH_PATH == "/readiness"  # its /health is 200 at once


@pytest.mark.parametrize(
    ("kind", "policy", "ok"),
    [
        ("sglang-router", "manual", True),
        ("sglang-router", "power_of_two", True),
        ("sglang-router", "kv_aware", False),
        ("sglang-router", "consistent_hash", False),
        ("sglang-router", "sticky_least_loaded", False),
        ("vllm-router", "manual", False),
        ("vllm-router", "sticky_least_loaded", True),
    ],
)
def test_each_router_takes_its_own_policies(kind: str, policy: str, ok: bool) -> None:
    if ok:
        assert RouterConfig(kind=kind, policy=policy).policy == policy
    else:
        with pytest.raises(ValueError, match=f"{kind} has no policy '{policy}'"):
            RouterConfig(kind=kind, policy=policy)


def test_sglang_router_counts_a_replica_once_its_worker_list_shows_it_healthy() -> None:
    # GET /workers of sglang-router 0.3.2 in front of two vLLM replicas (trimmed)
    listing = {
        "workers": [
            {"url": "http://127.0.0.1:8010", "model_id": "unknown", "is_healthy": True},
            {"url": "http://127.0.0.1:8000", "model_id": "unknown", "is_healthy": True},
        ],
        "total": 2,
    }
    urls = [r.base_url for r in REPLICAS]
    assert sglang_router.registered(listing, urls)
    assert sglang_router.registered(listing, [u + "/" for u in urls])
    one = {"workers": listing["workers"][:1], "total": 1}
    assert not sglang_router.registered(one, urls)  # a worker still registering (or dead)
    sick = {"workers": [dict(w, is_healthy=False) for w in listing["workers"]]}
    assert not sglang_router.registered(sick, urls)
    assert not sglang_router.registered(None, urls)  # no JSON yet
    assert not sglang_router.registered({"detail": "Not Found"}, urls)


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
            "engine": {"kind": "attach"},
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


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-router"])
def test_cache_aware_knobs_become_the_router_s_flags(kind: str) -> None:
    """Named in the config (and so sweepable: deployment.router.cache_threshold), passed to
    cache_aware only; the router's own default where unset."""
    cfg = RouterConfig(kind=kind, cache_threshold=0.7, balance_abs_threshold=8, max_tree_size=1024)
    argv = router.launch(cfg, REPLICAS, block_size=128, program="r").argv
    assert values(argv, "--cache-threshold") == ["0.7"]
    assert values(argv, "--balance-abs-threshold") == ["8"]
    assert values(argv, "--max-tree-size") == ["1024"]
    assert "--balance-rel-threshold" not in argv and "--eviction-interval-secs" not in argv
    other = RouterConfig(kind=kind, policy="round_robin", cache_threshold=0.7)
    assert "--cache-threshold" not in router.launch(other, REPLICAS, program="r").argv


def test_cache_aware_knobs_are_checked() -> None:
    with pytest.raises(ConfigError, match="cache_threshold"):
        parse_experiment({"deployment": {"router": {"cache_threshold": 1.5}}})
    with pytest.raises(ConfigError, match="balance_rel_threshold"):
        parse_experiment({"deployment": {"router": {"balance_rel_threshold": 0.5}}})
