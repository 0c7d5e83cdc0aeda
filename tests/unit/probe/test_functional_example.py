"""examples/functional.py, the shipped Functional API app, run against the stand-in vLLM (its
model client swapped for one on the stand-in's transport): every call a row, named by its task."""

import importlib.util
import sys
from types import ModuleType

import pytest
from helpers import ROOT
from test_functional_identity import Slow, who
from test_identity import llm, profiled

from kvscope.records.requests import RequestRecord


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "functional_example", ROOT / "examples" / "functional.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    model = llm(Slow())
    monkeypatch.setattr(module, "chat", lambda: model)
    return module


def test_the_example_app_names_its_tasks(
    example: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    rows: list[RequestRecord] = []
    with profiled(rows):
        example.main(["--topics", "1"])
    assert capsys.readouterr().out.count("[tides]") == 2
    runs = list(dict.fromkeys(r.workflow_run_id for r in rows))
    assert len(runs) == 2 and {r.thread_id for r in rows} == {"topic-tides"}
    for run in runs:  # the stand-in's reply is not "OK": the writer revises once
        mine = [r for r in rows if r.workflow_run_id == run]
        assert who(mine) == [("researcher", 1, None)] * 3 + [
            ("writer", 1, "researcher"),
            ("reviewer", 1, "writer"),
            ("writer", 2, "reviewer"),
        ]
        assert {r.graph_node for r in mine} == {
            "workflow/researcher",
            "workflow/writer",
            "workflow/reviewer",
        }
