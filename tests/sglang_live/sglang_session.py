"""What the SGLang tier's tests share besides the session's server (conftest.py)."""

from pathlib import Path
from typing import Any

import yaml
from helpers import ROOT, Up

PATHOLOGY = ROOT / "configs" / "kvflow-pathology-sglang.yaml"


def shipped_engine(config: Path = PATHOLOGY) -> dict[str, Any]:
    return dict(yaml.safe_load(config.read_text())["engine"])


def run_own_engines(sglang: Up, tmp: Path, command: str, config: dict[str, Any]) -> Path:
    """`kvscope COMMAND` on `config` (its runs under tmp/runs), with engines of its own: its own
    state directory, so the session's SGLang (another configuration) is not its concern."""
    (config["base"] if command == "sweep" else config)["runs_dir"] = str(tmp / "runs")
    path = tmp / f"{command}.yaml"
    path.write_text(yaml.safe_dump(config))
    runner = Up({**sglang.env, "KVSCOPE_STATE_DIR": str(tmp / "state")}, {}, tmp)
    result = runner.cli(command, str(path), timeout=1500)
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp / "runs"
