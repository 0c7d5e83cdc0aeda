"""Runs last in the integration session: `engine down` must leave no process behind."""

import psutil
import pytest
from helpers import Up

from kvscope.engines.process import group_members, port_free

pytestmark = pytest.mark.engine


def test_down_leaves_nothing_running(up: Up) -> None:
    pid = up.state["pid"]
    family = [pid, *up.state["descendants"]]
    assert all(psutil.pid_exists(p) for p in family)
    result = up.cli("engine", "down")
    assert result.returncode == 0, result.stderr
    assert "no process of it is left" in result.stdout
    assert group_members(pid) == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in family)
    port = int(up.base.rsplit(":", 1)[1])
    assert port_free("127.0.0.1", port)
    assert not (up.state_dir / "engine.json").exists()
    assert up.cli("engine", "status").returncode == 1
