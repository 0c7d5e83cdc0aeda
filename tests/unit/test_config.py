from pathlib import Path

import pytest

from kvscope.config import EngineConfig, config_hash, load_yaml, parse_engine
from kvscope.errors import ConfigError


def test_defaults_are_the_embedded_engine() -> None:
    cfg = parse_engine({})
    assert cfg.kind == "vllm"
    assert cfg.prefix_cache is True
    assert cfg.kv_capacity_tokens is None


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"kind": "attach"}, "needs `url`"),
        ({"kind": "vllm", "eviction_policy": "lfu"}, "LRU only"),
        ({"kind": "vllm", "hierarchical_cache": True}, "SGLang feature"),
        ({"port": 5557}, "kv_events_port must differ"),
        ({"kind": "tgi"}, "kind"),
        ({"bogus": 1}, "bogus"),
        ({"kv_capacity_tokens": 0}, "kv_capacity_tokens"),
        ({"kind": "sglang", "hierarchical_cache": True, "prefix_cache": False}, "needs prefix"),
        ({"kind": "sglang", "eviction_policy": "tlru"}, "threshold > next_prompt_estimate"),
        (
            {
                "kind": "sglang",
                "eviction_policy": "tlru",
                "eviction_policy_config": {"threshold": 10, "next_prompt_estimate": 10},
            },
            "threshold > next_prompt_estimate",
        ),
    ],
)
def test_invalid_configs_give_one_line(data: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_engine(data, "x.yaml")
    message = str(err.value)
    assert fragment in message
    assert message.startswith("x.yaml: ")
    assert "\n" not in message


def test_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(listy)


def test_config_hash_is_stable_and_sensitive() -> None:
    a = EngineConfig(kv_capacity_tokens=4096, port=8001)
    b = EngineConfig(port=8001, kv_capacity_tokens=4096)
    c = EngineConfig(port=8001, kv_capacity_tokens=8192)
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(c)
