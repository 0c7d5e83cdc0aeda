"""One real embedded engine for the whole integration session, started with `kvscope engine up`.

Tests that run workloads pass this engine's exact config, so `kvscope run` reuses it instead of
starting a second one; tests/integration/test_teardown.py stops it and checks nothing is left.
"""

import json
import os
import sys
import time
from collections.abc import Iterator

import pytest
from helpers import CAPACITY, Up, free_port


@pytest.fixture(scope="session")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    state_dir = tmp_path_factory.mktemp("state")
    env = {**os.environ, "KVSCOPE_STATE_DIR": str(state_dir), "COLUMNS": "200"}
    port, kv = free_port(), free_port(2)
    handle = Up(env, {}, state_dir)
    t0 = time.monotonic()
    result = handle.cli(
        "engine", "up", "--port", str(port), "--kv-events-port", str(kv),
        "--kv-capacity-tokens", str(CAPACITY), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, f"engine up failed:\n{result.stdout}\n{result.stderr}"
    print(f"engine up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    handle.state = json.loads((state_dir / "engine.json").read_text())
    yield handle
    handle.cli("engine", "down")  # no-op when test_teardown already stopped it
