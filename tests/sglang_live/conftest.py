"""One real SGLang server (its CPU engine where there is no CUDA GPU) for the whole SGLang tier,
started with `kvscope engine up --engine sglang`, like the vLLM tier's (tests/integration).

Its engine section is configs/kvflow-pathology-sglang.yaml's (a 3,072-token pool, LRU), so the
pathology run reuses it; other tests pass its exact config to reuse it too. SGLang is installed
by scripts/setup.sh (`kvscope engine install --engine sglang`). test_live_teardown.py stops it.
"""

import json
import os
import sys
import time
from collections.abc import Iterator

import pytest
import yaml
from helpers import Up, free_port
from sglang_session import shipped_engine

from kvscope.engines import sglang_install
from kvscope.engines.sglang import gpu_present


@pytest.fixture(scope="session")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    if not sglang_install.complete(cpu=not gpu_present()):
        pytest.fail(
            f"SGLang is not installed in {sglang_install.venv_root(cpu=not gpu_present())}: "
            "run scripts/setup.sh (it runs `kvscope engine install --engine sglang`)"
        )
    state_dir = tmp_path_factory.mktemp("sglang-state")
    env = {**os.environ, "KVSCOPE_STATE_DIR": str(state_dir), "COLUMNS": "200"}
    engine = shipped_engine() | {"port": free_port(), "kv_events_port": free_port(2)}
    path = state_dir / "engine.yaml"
    path.write_text(yaml.safe_dump(engine))
    handle = Up(env, {}, state_dir)
    t0 = time.monotonic()
    result = handle.cli("engine", "up", str(path), timeout=900)
    assert result.returncode == 0, f"engine up failed:\n{result.stdout}\n{result.stderr}"
    print(f"SGLang up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    handle.state = json.loads((state_dir / "engine.json").read_text())
    yield handle
    handle.cli("engine", "down")  # a no-op when test_teardown already stopped it
