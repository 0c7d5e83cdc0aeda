"""probe/task_launches.py: the wrap of LangGraph's task callable, alone."""

import sys
import threading
from typing import Any

import langgraph.func
import pytest
from langgraph.func import entrypoint, task

from kvscope.probe import task_launches

ORIGINAL = langgraph.func._TaskFunction.__call__


class Broken:
    """A tracker whose every method fails: the app's tasks still run."""

    def __init__(self) -> None:
        self.asked = 0

    def launched(self, config: Any) -> Any:
        self.asked += 1
        raise RuntimeError("tracker bug")


@pytest.fixture(autouse=True)
def restored() -> Any:
    yield
    task_launches.uninstall()
    assert langgraph.func._TaskFunction.__call__ is ORIGINAL


def test_installed_once_from_many_threads_and_restored() -> None:
    threads = [
        threading.Thread(target=task_launches.install, args=(lambda: None,)) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wrapped = langgraph.func._TaskFunction.__call__
    assert wrapped is not ORIGINAL and wrapped.__wrapped__ is ORIGINAL  # type: ignore[attr-defined]
    task_launches.uninstall()
    assert langgraph.func._TaskFunction.__call__ is ORIGINAL
    task_launches.uninstall()  # twice: nothing to do


def test_a_failing_tracker_never_fails_the_app() -> None:
    tracker = Broken()
    assert task_launches.install(lambda: tracker)

    @task
    def double(x: int) -> int:
        return 2 * x

    @entrypoint()
    def workflow(x: int) -> list[int]:
        return [f.result() for f in [double(x), double(x + 1)]]

    assert workflow.invoke(1) == [2, 4]
    assert tracker.asked == 2


def test_nothing_to_wrap_before_langgraph_func_is_imported(monkeypatch: Any) -> None:
    monkeypatch.delitem(sys.modules, "langgraph.func")
    assert task_launches.install(lambda: None) is False
    assert "langgraph.func" not in sys.modules  # never imported by kvscope
