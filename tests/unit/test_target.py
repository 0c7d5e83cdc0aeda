"""What a run says it is about to do with its engine: start, reuse or attach (target.opening)."""

from pathlib import Path

import pytest

from kvscope import target
from kvscope.config import parse_experiment
from kvscope.engines import make_engine
from kvscope.engines.base import Endpoints
from kvscope.engines.runtime import RunningEngine


def said(data: dict) -> str:
    cfg = parse_experiment(data, "test")
    return target.opening(cfg, make_engine(cfg.engine))


def test_a_new_engine_is_started_and_an_attached_one_attached() -> None:
    assert said({"engine": {"kind": "vllm"}}) == "starting vllm"
    assert said({"engine": {"kind": "attach", "url": "http://h:9"}}) == "attaching to http://h:9"
    assert said({"deployment": {"replicas": 2}}).startswith("starting 2 x vllm + ")


def test_an_engine_left_up_with_this_config_is_said_to_be_reused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def up(engine: object) -> RunningEngine:
        ends = Endpoints("http://127.0.0.1:8123", None, None)
        return RunningEngine(engine, ends, None, None, None, reused_pid=4242)  # type: ignore[arg-type]

    monkeypatch.setattr(target, "reusable", up)
    assert said({"engine": {"kind": "vllm"}}) == (
        "reusing the running vllm (pid 4242, http://127.0.0.1:8123)"
    )


class Wire:
    """An engine stand-in that says whether it evicts by priority."""

    def __init__(self, why: str | None) -> None:
        self.why, self.asked = why, []

    def priority_eviction(self, base_url: str, headers: dict[str, str]) -> str | None:
        self.asked.append(base_url)
        return self.why


def unheeded(data: dict, wire: Wire) -> str | None:
    cfg = parse_experiment(data, "test")
    engine = make_engine(cfg.engine)
    ends = Endpoints("http://127.0.0.1:9001", None, None)
    handle = RunningEngine(engine, ends, None, None, None)
    tgt = target.Target("http://127.0.0.1:9000", (target.Cache(None, Path("."), handle),))
    return target.hints_unheeded(cfg, tgt, wire, {})  # type: ignore[arg-type]


def test_hints_are_checked_with_the_engine_and_a_router_that_drops_them() -> None:
    sglang = {"engine": {"kind": "sglang", "eviction_policy": "priority"}}
    hinted = sglang | {"eviction_hints": "steps-to-execution"}
    assert unheeded(sglang, Wire("no")) is None  # no hints: nothing to say
    wire = Wire(None)
    assert unheeded(hinted, wire) is None and wire.asked == ["http://127.0.0.1:9001"]
    assert unheeded(hinted, Wire("its policy is lru")) == "its policy is lru"
    behind = hinted | {"deployment": {"replicas": 2, "router": {"kind": "sglang-router"}}}
    why = unheeded(behind, Wire(None))
    assert why is not None and "sglang-router" in why and "drops `priority`" in why
    vllm_router = hinted | {"deployment": {"replicas": 2, "router": {"kind": "vllm-router"}}}
    assert unheeded(vllm_router, Wire(None)) is None  # forwards the body as sent
