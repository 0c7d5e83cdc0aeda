import json
import socket
import sys
from pathlib import Path

import pytest
from helpers import VLLM_FIXTURES, free_port

from kvscope.config import EngineConfig
from kvscope.engines.detect import parse_metrics
from kvscope.engines.vllm import BLOCK_SIZE, VllmEngine
from kvscope.errors import ConfigError, EngineNotInstalled, PortInUse


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_launch_has_the_telemetry_flags() -> None:
    launch = VllmEngine(EngineConfig(port=8011, kv_events_port=6011)).launch()
    argv = launch.argv
    assert argv[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
    for required in (
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enforce-eager",
    ):
        assert required in argv
    assert flag(argv, "--port") == "8011"
    assert flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--max-model-len") == "2048"
    assert "--num-gpu-blocks-override" not in argv  # engine default capacity
    env = dict(launch.env)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


@pytest.mark.parametrize(("tokens", "blocks"), [(2048, 17), (4096, 33), (4000, 33), (4097, 34)])
def test_capacity_becomes_blocks_plus_the_null_block(tokens: int, blocks: int) -> None:
    engine = VllmEngine(EngineConfig(kv_capacity_tokens=tokens))
    argv = engine.launch().argv
    assert int(flag(argv, "--num-gpu-blocks-override")) == blocks
    assert (blocks - 1) * BLOCK_SIZE >= tokens


@pytest.mark.parametrize(
    ("page", "tokens", "blocks"), [(32, 2048, 65), (32, 2050, 66), (64, 4096, 65)]
)
def test_capacity_counts_in_the_configured_block_size(page: int, tokens: int, blocks: int) -> None:
    engine = VllmEngine(EngineConfig(kv_capacity_tokens=tokens, page_size=page))
    argv = engine.launch().argv
    assert int(flag(argv, "--num-gpu-blocks-override")) == blocks
    assert int(flag(argv, "--block-size")) == page


def test_the_cpu_build_refuses_a_block_size_off_its_multiple() -> None:
    with pytest.raises(ConfigError, match=r"page_size=16: .* multiples of 32"):
        VllmEngine(EngineConfig(page_size=16)).preflight()


def test_kv_events_config_matches_the_endpoints() -> None:
    engine = VllmEngine(EngineConfig(kv_events_port=6100))
    events = json.loads(flag(engine.launch().argv, "--kv-events-config"))
    ep = engine.endpoints()
    assert events["enable_kv_cache_events"] is True
    assert events["publisher"] == "zmq"
    assert events["endpoint"] == ep.kv_events == "tcp://127.0.0.1:6100"
    assert events["replay_endpoint"] == ep.kv_events_replay == "tcp://127.0.0.1:6101"
    # vLLM connects to a non-wildcard endpoint: the subscriber side must bind.
    assert ep.kv_events_subscriber_binds


def test_switches() -> None:
    argv = (
        VllmEngine(EngineConfig(prefix_cache=False, kv_events=False, extra_args=("--seed", "7")))
        .launch()
        .argv
    )
    assert "--no-enable-prefix-caching" in argv
    assert "--enable-prefix-caching" not in argv
    assert "--kv-events-config" not in argv
    assert argv[-2:] == ("--seed", "7")


def test_capacity_from_the_engines_own_metrics() -> None:
    families = parse_metrics((VLLM_FIXTURES / "metrics.prom").read_text())
    facts = VllmEngine.runtime_facts(families)
    # recorded with --num-gpu-blocks-override 17: 16 usable blocks of 128
    assert facts["capacity_tokens"] == 2048
    assert facts["block_size"] == 128
    assert facts["kv_cache_dtype"] == "auto"
    assert VllmEngine.owns_metrics(families)
    counters = VllmEngine.counters(families)
    assert counters["prompt_tokens_total"] and counters["prompt_tokens_total"] > 0
    assert counters["cached_tokens_total"] is not None


def test_preflight_missing_engine(isolated_dirs: Path) -> None:
    with pytest.raises(EngineNotInstalled, match="kvscope engine install"):
        VllmEngine(EngineConfig()).preflight()


def test_preflight_bad_model_path(tmp_path: Path) -> None:
    cfg = EngineConfig(python=sys.executable, model=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        VllmEngine(cfg).preflight()


def test_preflight_capacity_below_context(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    cfg = EngineConfig(python=sys.executable, model=str(tmp_path), kv_capacity_tokens=1024)
    with pytest.raises(ConfigError, match="below context_length"):
        VllmEngine(cfg).preflight()


@pytest.mark.parametrize("which", ["http", "kv"])
def test_preflight_occupied_port(tmp_path: Path, which: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    port, kv = free_port(), free_port(2)
    held = port if which == "http" else kv
    cfg = EngineConfig(python=sys.executable, model=str(tmp_path), port=port, kv_events_port=kv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", held))
        s.listen()
        with pytest.raises(PortInUse, match=f"port {held} .* already in use"):
            VllmEngine(cfg).preflight()
    VllmEngine(cfg).preflight()  # free again: passes


def test_tool_calls_are_served_unless_the_config_names_a_parser() -> None:
    argv = VllmEngine(EngineConfig()).launch().argv
    assert "--enable-auto-tool-choice" in argv and flag(argv, "--tool-call-parser") == "hermes"
    own = ("--tool-call-parser", "llama3_json")
    argv = VllmEngine(EngineConfig(extra_args=own)).launch().argv
    assert argv.count("--tool-call-parser") == 1 and argv[-2:] == own
