"""The policy x capacity grid on forked processes (sim.grid) gives what the sequential grid
gives: the same summaries in the same order, the same fidelity, the same errors."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvscope.errors import KvscopeError
from kvscope.replaying import plan_of, replay_document
from kvscope.sim.grid import run_cells
from kvscope.sim.inputs.sources import load_source
from kvscope.sim.plan import run_plan

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "replay"
POLICIES = "lru,belady,steps-to-execution,predicted-next-agent"
CAPACITIES = "2048,3456,4096"


def untimed(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results less `seconds` (each cell's simulation time: differs from run to run)."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in results]


@pytest.mark.parametrize("cache_outputs", [True, False])
def test_parallel_grid_equals_sequential_on_a_run(cache_outputs: bool) -> None:
    source = load_source(FIXTURES / "pathology")
    plan = plan_of(source, POLICIES, CAPACITIES, None, cache_outputs)
    sequential = replay_document(source, Path("run"), plan, jobs=1)
    steps: list[tuple[str, int]] = []
    parallel = replay_document(source, Path("run"), plan, lambda p, c: steps.append((p, c)), 2)
    assert len(parallel["results"]) == 4 * 3
    cells = [(p, int(c)) for p in POLICIES.split(",") for c in CAPACITIES.split(",")]
    assert [(r["policy"], r["requested_capacity_tokens"]) for r in parallel["results"]] == cells
    assert untimed(parallel.pop("results")) == untimed(sequential.pop("results"))
    assert parallel == sequential
    assert sorted(steps) == sorted(cells)  # every cell reported once, in completion order


def test_parallel_grid_keeps_the_fidelity_of_the_engines_own_cell() -> None:
    source = load_source(FIXTURES / "pathology")
    own, cap = source.policy or "lru", source.trace.capacity_tokens
    assert cap is not None
    plan = plan_of(source, f"{own},belady", f"2048,{cap}", None)
    sequential, parallel = run_plan(source, plan, jobs=1), run_plan(source, plan, jobs=3)
    assert parallel.fidelity is not None
    assert parallel.fidelity == sequential.fidelity
    assert [replace(s, seconds=0.0) for s in parallel.summaries] == [
        replace(s, seconds=0.0) for s in sequential.summaries
    ]


def boom(policy: str, capacity: int) -> str:
    if capacity >= 2:
        raise KvscopeError(f"cell {policy} @ {capacity} failed")
    return f"{policy}@{capacity}"


def test_a_failing_cell_raises_the_error_sequential_order_would() -> None:
    cells = [("a", 1), ("b", 1), ("c", 2), ("d", 3)]
    for jobs in (1, 2, 4):
        with pytest.raises(KvscopeError, match=r"^cell c @ 2 failed$"):
            run_cells(boom, cells, jobs)
    assert run_cells(boom, cells[:2], 2) == ["a@1", "b@1"]
    with pytest.raises(KvscopeError, match="--jobs must be at least 1"):
        run_cells(boom, cells, 0)


def test_cli_jobs_writes_the_same_json_and_refuses_zero(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvscope.cli import app

    runner, outs = CliRunner(), []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.json"
        args = ["replay", str(FIXTURES / "pathology"), "--policy", POLICIES, "--capacity-tokens"]
        args += [CAPACITIES, "--jobs", jobs, "--json", str(out), "--no-write", "--no-mlflow"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        outs.append(untimed(json.loads(out.read_text())))
    assert outs[0] == outs[1] and len(outs[0]) == 12
    result = runner.invoke(app, ["replay", str(FIXTURES / "pathology"), "--jobs", "0"])
    assert result.exit_code != 0 and "--jobs must be at least 1, got 0" in result.output
