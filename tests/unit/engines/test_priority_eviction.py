"""Whether a server evicts by the calls' priority (the eviction hints' lever), asked of the
server itself: SGLang's /get_server_info names its radix eviction policy; vLLM has none."""

from typing import Any

import httpx
import pytest

from kvscope.config import EngineConfig
from kvscope.engines import sglang
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine


def serve(monkeypatch: pytest.MonkeyPatch, reply: Any) -> list[str]:
    asked: list[str] = []

    def get(url: str, **_: Any) -> httpx.Response:
        asked.append(url)
        if isinstance(reply, Exception):
            raise reply
        return httpx.Response(200, json=reply, request=httpx.Request("GET", url))

    monkeypatch.setattr(sglang.httpx, "get", get)
    return asked


@pytest.mark.parametrize(
    ("kind", "configured", "served", "evicts"),
    [
        ("sglang", "lru", {"radix_eviction_policy": "priority"}, True),  # the server decides
        ("sglang", "priority", {"radix_eviction_policy": "lru"}, False),
        ("sglang", "priority", {}, True),  # an older server: its config
        ("attach", "lru", {"radix_eviction_policy": "priority"}, True),
        ("attach", "lru", {}, False),  # attached and silent: unknown
    ],
)
def test_sglang_asks_its_server(
    monkeypatch: pytest.MonkeyPatch, kind: str, configured: str, served: dict, evicts: bool
) -> None:
    asked = serve(monkeypatch, served)
    cfg = EngineConfig(kind=kind, eviction_policy=configured, url="http://h:1")
    why = SglangEngine(cfg).priority_eviction("http://h:1", {})
    assert asked == ["http://h:1/get_server_info"]
    assert (why is None) == evicts
    if not evicts:
        assert "--radix-eviction-policy priority" in (why or "")


def test_an_unreachable_server_falls_back_to_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    serve(monkeypatch, httpx.ConnectError("refused"))
    assert (
        SglangEngine(EngineConfig(kind="sglang", eviction_policy="priority")).priority_eviction(
            "http://h:1", {}
        )
        is None
    )
    why = SglangEngine(EngineConfig(kind="sglang")).priority_eviction("http://h:1", {})
    assert why is not None and "this server's is lru" in why


def test_vllm_has_no_priority_lever() -> None:
    why = VllmEngine(EngineConfig()).priority_eviction("http://h:1", {})
    assert why is not None and "no per-request eviction priority" in why
