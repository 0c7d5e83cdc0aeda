"""The deployment section: several replicas of the engine behind a router (issue 17)."""

from pathlib import Path

import pytest

from kvscope.config import (
    ExperimentConfig,
    as_dict,
    check_experiment,
    config_hash,
    load_yaml,
    parse_experiment,
)
from kvscope.errors import ConfigError
from kvscope.records.requests import COLUMNS

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_single_engine_configs_are_unchanged() -> None:
    # Hashes recorded before the deployment section existed: a run without it keeps its hash.
    assert config_hash(ExperimentConfig()) == "e8791a5a209e"
    demo = parse_experiment(load_yaml(CONFIGS / "demo.yaml"))
    assert demo.deployment is None
    assert config_hash(demo) == "e8791a5a209e"
    kvflow = parse_experiment(load_yaml(CONFIGS / "kvflow-pathology.yaml"))
    assert config_hash(kvflow) == "6dd6402115e6"


def test_a_deployment_parses_and_changes_the_hash() -> None:
    cfg = parse_experiment(
        {"deployment": {"replicas": 2, "router": {"policy": "round_robin", "port": 30010}}}
    )
    d = cfg.deployment
    assert d is not None
    assert (d.replicas, d.router.kind, d.router.policy, d.router.port) == (
        2, "vllm-router", "round_robin", 30010,
    )  # fmt: skip
    assert d.replica_names() == ["r0", "r1"]
    assert config_hash(cfg) != config_hash(ExperimentConfig())
    other = parse_experiment({"deployment": {"router": {"policy": "cache_aware"}}})
    assert config_hash(other) != config_hash(cfg)


def test_attached_replicas() -> None:
    cfg = parse_experiment(
        {
            "engine": {"kind": "attach"},
            "deployment": {
                "replicas": 2,
                "router": {"url": "http://10.0.0.1:30000", "policy": "kv_aware"},
                "replica_urls": ["http://10.0.0.2:8000", "http://10.0.0.3:8000"],
                "kv_events_endpoints": ["tcp://10.0.0.2:5557", "tcp://10.0.0.3:5557"],
            },
        }
    )
    assert cfg.deployment is not None and cfg.deployment.router.url


def test_requests_gain_a_replica_column() -> None:
    assert "replica" in COLUMNS


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"replicas": 0}, "deployment.replicas"),
        ({"router": {"kind": "nginx"}}, "deployment.router.kind"),
        ({"router": {"policy": "fastest"}}, "deployment.router.policy"),
        ({"router": {"kind": "sglang-router", "policy": "kv_aware"}}, "no policy 'kv_aware'"),
        ({"router": {"port": 29000}}, "metrics_port must differ"),
        ({"router": {"port": 8010}}, "is a replica's"),
        ({"port_stride": 1}, "port_stride"),
        ({"replicas": 16, "port_stride": 1000}, "pass 65535"),
        ({"replica_urls": ["http://a:1", "http://b:1"]}, "for attached replicas"),
        ({"router": {"url": "http://r:1"}}, "attaches to a running router"),
        ({"bogus": 1}, "deployment.bogus"),
    ],
)
def test_bad_deployments_give_one_line(data: dict, fragment: str) -> None:
    engine = {"port": 8000, "kv_events_port": 55557}
    with pytest.raises(ConfigError) as err:
        parse_experiment({"engine": engine, "deployment": data}, "x.yaml")
    message = str(err.value)
    assert fragment in message and message.startswith("x.yaml: ") and "\n" not in message


def test_overlapping_replica_ports() -> None:
    # replica 1's HTTP port (8000 + 2) is replica 0's KV events replay port (8001 + 1)
    with pytest.raises(ConfigError, match="ports overlap"):
        parse_experiment(
            {
                "engine": {"port": 8000, "kv_events_port": 8001},
                "deployment": {"replicas": 2, "port_stride": 2},
            }
        )


def test_attach_needs_one_url_per_replica() -> None:
    with pytest.raises(ConfigError, match="one URL per replica"):
        parse_experiment(
            {
                "engine": {"kind": "attach"},
                "deployment": {"replicas": 2, "replica_urls": ["http://a:1"]},
            }
        )
    with pytest.raises(ConfigError, match="kv_aware on attached replicas"):
        parse_experiment(
            {
                "engine": {"kind": "attach"},
                "deployment": {
                    "replica_urls": ["http://a:1", "http://b:1"],
                    "router": {"policy": "kv_aware"},
                },
            }
        )


def test_attach_url_is_one_engine_s_own() -> None:
    """One attached engine needs `engine.url`; an attached deployment names its replicas in
    deployment.replica_urls, and an engine.url there (which would be ignored) is refused."""
    with pytest.raises(ConfigError, match="needs `url`"):
        parse_experiment({"engine": {"kind": "attach"}})
    with pytest.raises(ConfigError, match=r"engine\.url: a deployment's attached replicas"):
        parse_experiment(
            {
                "engine": {"kind": "attach", "url": "http://r:1"},
                "deployment": {"replica_urls": ["http://a:1", "http://b:1"]},
            }
        )
    cfg = parse_experiment(
        {"engine": {"kind": "attach"}, "deployment": {"replica_urls": ["http://a:1", "http://b:1"]}}
    )  # replicas attached, the router launched by kvscope in front of them
    assert cfg.deployment is not None and cfg.deployment.router.url is None


def test_kv_aware_needs_kv_events() -> None:
    with pytest.raises(ConfigError, match="kv_aware reads the replicas' KV events"):
        parse_experiment(
            {"engine": {"kv_events": False}, "deployment": {"router": {"policy": "kv_aware"}}}
        )


def test_recorded_config_of_a_single_engine_has_no_deployment_key() -> None:
    assert "deployment" not in as_dict(ExperimentConfig())
    with_one = parse_experiment({"deployment": {"replicas": 2}})
    assert as_dict(with_one)["deployment"]["replicas"] == 2


def test_run_takes_a_deployment() -> None:
    check_experiment(ExperimentConfig())  # a single engine: as before
    check_experiment(parse_experiment({"deployment": {"replicas": 2}}))


def test_the_router_sweep_points_are_valid_deployments() -> None:
    sweep = load_yaml(CONFIGS / "router.yaml")
    policies = sweep["matrix"]["deployment.router.policy"]
    assert policies == ["round_robin", "cache_aware", "kv_aware"]
    for policy in policies:
        base = sweep["base"]
        data = base | {"deployment": base["deployment"] | {"router": {"policy": policy}}}
        cfg = parse_experiment(data, "router.yaml")
        assert cfg.deployment is not None and cfg.deployment.replicas == 2
        assert cfg.deployment.router.policy == policy
