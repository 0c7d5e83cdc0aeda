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
