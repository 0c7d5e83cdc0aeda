"""Runs last in the SGLang tier: `engine down` leaves no SGLang process behind."""

import psutil
import pytest
from helpers import Up

from kvscope.engines.process import group_members, port_free

pytestmark = pytest.mark.engine


def test_down_leaves_nothing_running(sglang: Up) -> None:
    pid = sglang.state["pid"]
    family = [pid, *sglang.state["descendants"]]
    assert len(family) >= 3  # SGLang's server, scheduler and detokenizer processes
    result = sglang.cli("engine", "down")
    assert result.returncode == 0, result.stderr
    assert group_members(pid) == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in family)
    assert port_free("127.0.0.1", int(sglang.base.rsplit(":", 1)[1]))
