"""One real embedded engine for the whole integration session, started with `kvscope engine up`.

Tests that run workloads pass this engine's exact config, so `kvscope run` reuses it instead of
starting a second one; tests/integration/test_teardown.py stops it and checks nothing is left.

The router tests share two more replicas (`replica_pair`, replica_pair.py): the tests that use
them are run one after another (their order kept, moved to where the first of them is), the
pair is started for the first and stopped after the last, when its processes and ports are
checked gone (a leftover fails that test's teardown); a user after a gap gets a fresh pair.
"""

import json
import os
import sys
import time
from collections.abc import Iterator

import pytest
from helpers import CAPACITY, Up, free_port
from replica_pair import ReplicaPair, start_pair

PAIR = "replica_pair"
_PAIR: list[ReplicaPair] = []  # the pair while a run of its tests lasts


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


@pytest.fixture
def engine_state(up: Up, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process finds the session's engine (`kvscope engine up`'s state), as the CLI does."""
    monkeypatch.setenv("KVSCOPE_STATE_DIR", str(up.state_dir))


@pytest.fixture
def replica_pair(tmp_path_factory: pytest.TempPathFactory) -> ReplicaPair:
    """The two router replicas, started for the first of the consecutive tests using them."""
    if not _PAIR:
        _PAIR.append(start_pair(free_port(20), tmp_path_factory.mktemp("replicas")))
    return _PAIR[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The replica pair's tests, in their order, where the first of them is."""
    users = [i for i in items if PAIR in getattr(i, "fixturenames", ())]
    if users:
        first, moved = items.index(users[0]), {id(i) for i in users}
        rest = [i for i in items if id(i) not in moved]
        items[:] = rest[:first] + users + rest[first:]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last consecutive test using the pair: stop it, check nothing of it is left."""
    uses = [PAIR in getattr(i, "fixturenames", ()) for i in (item, nextitem) if i is not None]
    if _PAIR and uses[0] and not any(uses[1:]):
        _PAIR.pop().close()


def pytest_sessionfinish() -> None:
    while _PAIR:  # an interrupted session: stopped all the same
        for handle in _PAIR.pop().handles.values():
            handle.stop()
