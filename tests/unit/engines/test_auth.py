"""Where the engine's API key comes from (engines/auth.py), and that a launch never shows it."""

import pytest

from kvscope.config import EngineConfig
from kvscope.engines.auth import api_key, headers
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import ConfigError


def test_the_named_variable_first_then_kvscope_then_openai() -> None:
    env = {"MINE": "k1", "KVSCOPE_API_KEY": "k2", "OPENAI_API_KEY": "k3"}
    assert api_key("MINE", env) == "k1"
    assert api_key(None, env) == "k2"
    assert api_key(None, {"OPENAI_API_KEY": "k3"}) == "k3"
    assert api_key(None, {"OPENAI_API_KEY": ""}) is None
    with pytest.raises(ConfigError, match="MINE, which is not set"):
        api_key("MINE", {"KVSCOPE_API_KEY": "k2"})  # named but missing: not silently another


def test_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSCOPE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert headers() == {}
    monkeypatch.setenv("KVSCOPE_API_KEY", "sekrit")
    assert headers() == {"Authorization": "Bearer sekrit"}


def test_a_launched_vllm_gets_the_key_in_its_environment_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENGINE_KEY", "sekrit-123")
    launch = VllmEngine(EngineConfig(api_key_env="ENGINE_KEY", python="/usr/bin/python3")).launch()
    assert dict(launch.env)["VLLM_API_KEY"] == "sekrit-123"
    assert "sekrit-123" not in " ".join(launch.argv)
    assert "sekrit-123" not in launch.shell() and "VLLM_API_KEY='***'" in launch.shell()
    plain = VllmEngine(EngineConfig(python="/usr/bin/python3")).launch()
    assert "VLLM_API_KEY" not in dict(plain.env)  # a default key is sent, never imposed
