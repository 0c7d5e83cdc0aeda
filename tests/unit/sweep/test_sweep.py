"""Sweeps without an engine: expansion, validation, grouping, bookkeeping, interrupts."""

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import ROOT
from typer.testing import CliRunner

from kvscope import sweep as sweep_mod
from kvscope.cli import app
from kvscope.config import EngineConfig, ExperimentConfig
from kvscope.engines import make_engine
from kvscope.engines import state as engine_state
from kvscope.engines.base import Endpoints
from kvscope.engines.runtime import RunningEngine, reusable
from kvscope.errors import ConfigError, EngineError, EngineStartError
from kvscope.sweep import (
    FAILED,
    INTERRUPTED,
    NOT_RUN,
    OK,
    Sweep,
    apply,
    expand,
    group_engine,
    parse_sweep,
    point_label,
    reset_prefix_cache,
    run_sweep,
)
from kvscope.sweep.spec import short_value

PRESSURE = {
    "name": "p",
    "base": {"workload": {"workflows": 2}, "engine": {"context_length": 1024}},
    "matrix": {
        "engine.kv_capacity_tokens": [None, 2048, 1024],
        "workload.concurrency": [1, 4],
    },
}


def sweep_of(data: dict[str, Any], tmp_path: Path) -> Sweep:
    return parse_sweep(data, "s.yaml", runs_dir=tmp_path / "runs")


# --- expansion and names ---------------------------------------------------------------------


def test_the_matrix_is_a_cartesian_product_then_the_explicit_points() -> None:
    changes = expand({"a.x": [1, 2], "b.y": ["u", "v", "w"]}, [{"a.x": 9}, {"c.z": True, "a.x": 1}])
    assert len(changes) == 2 * 3 + 2
    assert changes[:4] == [
        {"a.x": 1, "b.y": "u"},
        {"a.x": 1, "b.y": "v"},
        {"a.x": 1, "b.y": "w"},
        {"a.x": 2, "b.y": "u"},
    ]
    assert changes[6:] == [{"a.x": 9}, {"c.z": True, "a.x": 1}]
    assert expand({}, [{"a.x": 1}]) == [{"a.x": 1}]


def test_points_are_named_by_their_changes() -> None:
    assert point_label("p", {"engine.kv_capacity_tokens": None, "workload.concurrency": 4}) == (
        "p-kv_capacity_tokens=default-concurrency=4"
    )
    assert point_label("r", {"engine.prefix_cache": False}) == "r-prefix_cache=false"
    # two paths ending alike keep their full path
    assert point_label("s", {"a.n": 1, "b.n": 2}) == "s-a.n=1-b.n=2"
    assert point_label("s", {"workload.layout": "role-first"}) == "s-layout=role-first"
    assert point_label("s", {"x.y": "a b/c"}) == "s-y=a_b_c"


def test_a_long_mapping_is_named_by_two_leaves_and_a_hash() -> None:
    workload = {"workflow": "supervisor", "mode": "tasks", "workflows": 6, "concurrency": 2,
                "max_steps": 10, "tool": True, "workers": 4, "seed": 0}  # fmt: skip
    text = json.dumps(workload, separators=(",", ":"), sort_keys=True)
    digest = hashlib.sha1(text.encode()).hexdigest()[:6]
    assert short_value(workload) == f"supervisor+tasks~{digest}"
    assert point_label("e", {"workload": workload}) == f"e-workload=supervisor+tasks~{digest}"
    # the hash is of the sorted JSON: the same mapping written in another order has the same one
    assert short_value(dict(reversed(workload.items()))) == f"tasks+supervisor~{digest}"
    other = point_label("e", {"workload": {**workload, "workflows": 7}})
    assert other.startswith("e-workload=supervisor+tasks~") and other != point_label(
        "e", {"workload": workload}
    )
    # a short mapping or list stays its JSON (made safe); a long one of numbers shows numbers
    assert point_label("s", {"w": {"a": 1}}) == "s-w=_a_1_"
    assert short_value([1, 2]) == "[1,2]"
    assert short_value(list(range(20))).startswith("0+1~")
    assert (short_value(None), short_value(False), short_value(2.5)) == ("default", "false", "2.5")


def test_points_of_long_mappings_get_distinct_labels(tmp_path: Path) -> None:
    workload = {"workflow": "supervisor", "mode": "tasks", "concurrency": 2, "workers": 4}
    data = {**PRESSURE, "matrix": {}, "points": [{"workload": {**workload, "workflows": n}}
                                                 for n in (6, 7)]}  # fmt: skip
    first, second = (p.label for p in sweep_of(data, tmp_path).points)
    assert first.startswith("p-workload=supervisor+tasks~") and len(first) < 40
    assert second.startswith("p-workload=supervisor+tasks~") and second != first


def test_apply_sets_dotted_paths_on_a_copy() -> None:
    base = {"engine": {"kind": "vllm"}, "workload": None}
    out = apply(base, {"engine.port": 9000, "workload.synthetic.fixed_tokens": 64})
    assert out == {
        "engine": {"kind": "vllm", "port": 9000},
        "workload": {"synthetic": {"fixed_tokens": 64}},
    }
    assert base == {"engine": {"kind": "vllm"}, "workload": None}
    with pytest.raises(ConfigError, match=r"engine.kind.x: engine.kind is not a mapping"):
        apply(base, {"engine.kind.x": 1})


def test_a_sweep_expands_into_validated_experiments(tmp_path: Path) -> None:
    sw = sweep_of(PRESSURE, tmp_path)
    assert sw.name == "p" and len(sw.points) == 6
    first = sw.points[0].config
    assert isinstance(first, ExperimentConfig)
    assert first.name == "p-kv_capacity_tokens=default-concurrency=1"
    assert first.runs_dir == tmp_path / "runs"
    assert [(p.config.engine.kv_capacity_tokens, p.config.workload.concurrency)
            for p in sw.points] == [(None, 1), (None, 4), (2048, 1), (2048, 4), (1024, 1),
                                    (1024, 4)]  # fmt: skip
    assert {p.config.workload.workflows for p in sw.points} == {2}  # the base is kept


def test_the_base_can_be_a_run_config_file(tmp_path: Path) -> None:
    (tmp_path / "demo.yaml").write_text((ROOT / "configs" / "demo.yaml").read_text())
    (tmp_path / "s.yaml").write_text("base: demo.yaml\nmatrix:\n  workload.layout: [role-first]\n")
    sw = sweep_mod.load_sweep(tmp_path / "s.yaml")
    (point,) = sw.points
    assert point.label == "s-layout=role-first"
    assert point.config.workload.layout == "role-first"
    assert point.config.workload.workflows == 4  # from demo.yaml


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"matrix": {"workload.concurrency": [1, 0]}},
         r"^s.yaml: point s-concurrency=0: workload.concurrency: Input should be greater"),
        ({"matrix": {"workload.bogus": [1]}}, r"point s-bogus=1: workload.bogus: Extra inputs"),
        ({"matrix": {"engine.kind": ["vllm", "tgi"]}}, r"point s-kind=tgi: engine.kind: Input"),
        ({"matrix": {"workload.sharing": ["none"]}, "base": {"workload": {"layout": "role-first"}}},
         r"point s-sharing=none: workload: .*role-first does not combine with sharing none"),
        ({"matrix": {"workload.synthetic.fixed_tokens": [4000]},
          "base": {"workload": {"mode": "synthetic"}}},
         r"point s-fixed_tokens=4000: synthetic prompts need up to"),
        ({"matrix": {"runs_dir": ["x"]}}, r"runs_dir is the same for the whole sweep"),
        ({"points": [{"tracking.experiment": "x"}]}, r"tracking.experiment is the same for the"),
        ({"matrix": {"workload.concurrency": []}}, r"matrix workload.concurrency: needs at least"),
        ({}, r"a sweep needs a `matrix` or `points`"),
        ({"matrix": {"workload.concurrency": [2]}, "extra": 1}, r"^s.yaml: extra: Extra inputs"),
        ({"matrix": {"workload.concurrency": 2}}, r"matrix.workload.concurrency: Input should be"),
        ({"matrix": {"workload.concurrency": [2]}, "points": [{"workload.concurrency": 2}]},
         r"points s-concurrency=2 and s-concurrency=2 are the same experiment"),
    ],
)  # fmt: skip
def test_a_bad_point_is_a_one_line_error_before_anything_starts(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_sweep({"name": "s", **data}, "s.yaml")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "points", "engines"),
    [
        ("pressure", 6, 3),
        ("layout-ab", 2, 1),
        ("sharing-modes", 5, 1),
        ("radix-off", 2, 2),
        ("dynamic-pressure", 12, 3),
        ("router", 3, 3),  # each deployment point starts its own replicas and router
    ],
)
def test_the_shipped_sweeps_load(name: str, points: int, engines: int) -> None:
    sw = sweep_mod.load_sweep(ROOT / "configs" / f"{name}.yaml")
    assert (sw.name, len(sw.points), len(sw.groups())) == (name, points, engines)
    assert all(p.config.engine.port == EngineConfig().port for p in sw.points)  # default ports
    assert len({p.label for p in sw.points}) == points


# --- running, with a fake engine and fake runs -------------------------------------------------


@dataclass
class Fakes:
    """start_engine / run_point / reset_cache stand-ins that record what the sweep did."""

    runs_dir: Path
    fail: set[str] = field(default_factory=set)  # labels whose run raises
    partial: set[str] = field(default_factory=set)  # labels whose run returns an error
    interrupt: set[str] = field(default_factory=set)
    bad_engines: set[int | None] = field(default_factory=set)  # capacities that fail to start
    started: list[EngineConfig] = field(default_factory=list)
    stopped: list[EngineConfig] = field(default_factory=list)
    ran: list[tuple[str, EngineConfig | None]] = field(default_factory=list)
    resets: list[EngineConfig] = field(default_factory=list)
    replayed: list[str] = field(default_factory=list)
    up: EngineConfig | None = None

    @contextmanager
    def start_engine(self, cfg: EngineConfig, log: Path) -> Iterator[None]:
        if cfg.kv_capacity_tokens in self.bad_engines:
            raise EngineStartError("engine exited with code 1 before becoming healthy", "tail")
        self.started.append(cfg)
        self.up = cfg
        try:
            yield
        finally:
            self.up = None
            self.stopped.append(cfg)

    def reset_cache(self, cfg: EngineConfig) -> str | None:
        assert self.up == cfg, "cache reset without the point's engine up"
        self.resets.append(cfg)
        return None

    def run_point(self, cfg: ExperimentConfig, hooks: Any) -> SimpleNamespace:
        self.ran.append((cfg.name, self.up))
        run_dir = self.runs_dir / f"{cfg.name}-20260101-000000-abcdef"
        run_dir.mkdir(parents=True)
        if cfg.name in self.fail:
            raise RuntimeError("boom\nsecond line")
        if cfg.name in self.interrupt:
            raise KeyboardInterrupt
        return SimpleNamespace(
            benchmark_run_id=run_dir.name,
            run_dir=run_dir,
            mlflow_run_id="m-" + cfg.name,
            error="ReadTimeout: slow" if cfg.name in self.partial else None,
            workload=SimpleNamespace(workflows=2, failed=1),
            analysis=SimpleNamespace(
                agents=[SimpleNamespace(agent_id="planner", weighted_hit_ratio=0.5)],
                total=SimpleNamespace(weighted_hit_ratio=0.25),
            ),
        )

    def replay(self, run_dir: Path) -> None:
        assert self.up is not None or run_dir.name.startswith("d-"), "replayed with no engine"
        self.replayed.append(run_dir.name)
        if "concurrency=4" in run_dir.name:
            raise ValueError("no capacity\nmore")
        (run_dir / "replay.json").write_text("{}")

    def run(self, sw: Sweep, out: Path) -> sweep_mod.SweepRecord:
        return run_sweep(sw, out, start_engine=self.start_engine, run_point=self.run_point,
                         reset_cache=self.reset_cache, replay=self.replay)  # fmt: skip


def test_one_engine_per_engine_config_and_every_point_runs_on_its_own(tmp_path: Path) -> None:
    data = {**PRESSURE, "points": [{"engine.kv_capacity_tokens": 2048, "workload.workflows": 3}]}
    sw = sweep_of(data, tmp_path)
    fakes = Fakes(tmp_path / "runs")
    record = fakes.run(sw, tmp_path)
    # three capacities: three engines, each started once and stopped, in first-seen order
    assert [c.kv_capacity_tokens for c in fakes.started] == [None, 2048, 1024]
    assert fakes.stopped == fakes.started
    # the explicit 2048 point joins the 2048 engine's group
    assert [name for name, _ in fakes.ran] == [
        "p-kv_capacity_tokens=default-concurrency=1",
        "p-kv_capacity_tokens=default-concurrency=4",
        "p-kv_capacity_tokens=2048-concurrency=1",
        "p-kv_capacity_tokens=2048-concurrency=4",
        "p-kv_capacity_tokens=2048-workflows=3",
        "p-kv_capacity_tokens=1024-concurrency=1",
        "p-kv_capacity_tokens=1024-concurrency=4",
    ]
    for name, up in fakes.ran:
        point = next(p for p in sw.points if p.label == name)
        assert up == point.config.engine
    assert len(fakes.resets) == 7  # before every point
    assert {p.status for p in record.points} == {OK}


def test_replay_true_replays_each_finished_point_and_a_failed_replay_is_a_note(
    tmp_path: Path,
) -> None:
    data = {**PRESSURE, "matrix": {"workload.concurrency": [1, 4, 2]}}
    fakes = Fakes(tmp_path / "runs")
    fakes.run(sweep_of(data, tmp_path), tmp_path)
    assert fakes.replayed == []  # not asked for
    fakes = Fakes(tmp_path / "runs2", fail={"p-concurrency=2"})
    record = fakes.run(sweep_of({**data, "replay": True}, tmp_path / "2"), tmp_path)
    by_label = {p.label: p for p in record.points}
    # replayed after it ran, not after a failed point
    assert [n.rsplit("-", 3)[0] for n in fakes.replayed] == ["p-concurrency=1", "p-concurrency=4"]
    one, four, two = (by_label[f"p-concurrency={c}"] for c in (1, 4, 2))
    assert one.status == OK and one.replay == str(Path(one.run_dir or "") / "replay.json")
    assert four.status == OK and four.replay is None
    assert four.note == "replay failed: ValueError: no capacity"
    assert two.status == FAILED and two.replay is None
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["replay"] for p in doc["points"]] == [one.replay, None, None]


def test_a_deployment_point_starts_its_own_replicas(tmp_path: Path) -> None:
    data = {"name": "d", "base": {"name": "d", "deployment": {"replicas": 2}},
            "matrix": {"deployment.router.policy": ["round_robin", "cache_aware"]}}  # fmt: skip
    sw = sweep_of(data, tmp_path)
    assert [(g.deployed, len(g.points)) for g in sw.groups()] == [(True, 1), (True, 1)]
    fakes = Fakes(tmp_path / "runs")
    record = fakes.run(sw, tmp_path)
    # no group engine, no reset by the sweep: each run starts (and empties) its deployment
    assert fakes.started == [] and fakes.resets == []
    assert [(name, up) for name, up in fakes.ran] == [
        ("d-policy=round_robin", None), ("d-policy=cache_aware", None),
    ]  # fmt: skip
    assert {p.status for p in record.points} == {OK}


def test_the_command_fails_when_a_point_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sw = sweep_of(PRESSURE, tmp_path)
    fakes = Fakes(tmp_path / "runs", fail={"p-kv_capacity_tokens=default-concurrency=4"})
    monkeypatch.setattr("kvscope.cli.sweep.load_sweep", lambda *a, **k: sw)
    monkeypatch.setattr("kvscope.cli.sweep.preflight", lambda plan: None)
    monkeypatch.setattr("kvscope.cli.sweep.run_sweep", lambda plan, out, hooks: fakes.run(sw, out))
    monkeypatch.setattr("kvscope.cli.sweep._compare", lambda record, out: None)
    result = CliRunner().invoke(app, ["sweep", "x.yaml"])
    assert result.exit_code == 1
    assert "1 of 6 point(s) failed" in result.output


def test_sweep_json_records_failures_and_the_sweep_goes_on(tmp_path: Path) -> None:
    sw = sweep_of(PRESSURE, tmp_path)
    runs = tmp_path / "runs"
    fakes = Fakes(
        runs,
        fail={"p-kv_capacity_tokens=default-concurrency=4"},
        partial={"p-kv_capacity_tokens=1024-concurrency=1"},
        bad_engines={2048},
    )
    fakes.run(sw, tmp_path)
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["status"] == "done" and doc["finished_at"]
    assert doc["counts"] == {OK: 2, FAILED: 4}
    points = {p["label"]: p for p in doc["points"]}
    raised = points["p-kv_capacity_tokens=default-concurrency=4"]
    assert raised["status"] == FAILED
    assert raised["error"] == "RuntimeError: boom"
    assert raised["run_dir"] == str(
        runs / "p-kv_capacity_tokens=default-concurrency=4-20260101-000000-abcdef"
    )
    for label in (
        "p-kv_capacity_tokens=2048-concurrency=1",
        "p-kv_capacity_tokens=2048-concurrency=4",
    ):
        assert points[label]["status"] == FAILED
        assert points[label]["error"].startswith("engine: EngineStartError: engine exited")
        assert points[label]["run_dir"] is None
    partial = points["p-kv_capacity_tokens=1024-concurrency=1"]
    assert (partial["status"], partial["error"]) == (FAILED, "ReadTimeout: slow")
    assert partial["run_dir"] and partial["mlflow_run_id"]
    ok = points["p-kv_capacity_tokens=1024-concurrency=4"]
    assert ok["status"] == OK and ok["engine_group"] == 2
    assert (ok["hit_ratio"], ok["agent_hit_ratio"], ok["workflows_failed"]) == (
        0.25,
        {"planner": 0.5},
        1,
    )
    assert ok["overrides"] == {"engine.kv_capacity_tokens": 1024, "workload.concurrency": 4}
    assert ok["seconds"] is not None
    assert [g["points"] for g in doc["groups"]] == [[0, 1], [2, 3], [4, 5]]  # fmt: skip
    assert len(fakes.ran) == 4  # the failed engine's points never ran


def test_an_interrupt_stops_the_engine_and_records_what_ran(tmp_path: Path) -> None:
    sw = sweep_of(PRESSURE, tmp_path)
    fakes = Fakes(tmp_path / "runs", interrupt={"p-kv_capacity_tokens=2048-concurrency=1"})
    with pytest.raises(KeyboardInterrupt):
        fakes.run(sw, tmp_path)
    assert fakes.stopped == fakes.started and len(fakes.started) == 2
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["status"] == INTERRUPTED
    assert [p["status"] for p in doc["points"]] == [OK, OK, INTERRUPTED] + [NOT_RUN] * 3
    assert doc["points"][2]["run_dir"].endswith("-20260101-000000-abcdef")


# --- the group's engine: recorded where runs find it, then stopped ------------------------------


class FakeProcess:
    pid = os.getpid()  # alive, so the engine state reads as running

    def __init__(self) -> None:
        self.stopped = 0

    def descendants(self) -> list[int]:
        return []

    def stop(self) -> None:
        self.stopped += 1


def test_group_engine_is_reused_by_the_runs_and_stopped_after(
    isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = EngineConfig(kind="vllm", kv_capacity_tokens=2048, port=8200, kv_events_port=5700)
    proc = FakeProcess()
    starts: list[EngineConfig] = []

    def fake_start(engine: Any, log: Path, **_: Any) -> RunningEngine:
        starts.append(engine.config)
        endpoints = Endpoints("http://127.0.0.1:8200", None, None)
        return RunningEngine(engine, endpoints, None, proc, 1.0)  # type: ignore[arg-type]

    monkeypatch.setattr(sweep_mod.runner, "start", fake_start)
    with group_engine(cfg, isolated_dirs / "e.log"):
        assert reusable(make_engine(cfg)) is not None  # what run_experiment's running() checks
        other = cfg.model_copy(update={"kv_capacity_tokens": 4096})
        assert reusable(make_engine(other)) is None
        # a second group with the same engine config would reuse it without starting
        with group_engine(cfg, isolated_dirs / "e2.log"):
            pass
        assert proc.stopped == 0
    assert starts == [cfg]
    assert proc.stopped == 1
    assert engine_state.load() is None


def test_group_engine_stops_the_engine_on_ctrl_c(
    isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = FakeProcess()
    monkeypatch.setattr(
        sweep_mod.runner, "start",
        lambda e, log, **_: RunningEngine(e, Endpoints("http://x", None, None), None, proc, 1.0),  # type: ignore[arg-type]
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt), group_engine(EngineConfig(), isolated_dirs / "e.log"):
        raise KeyboardInterrupt
    assert proc.stopped == 1 and engine_state.load() is None


def test_preflight_refuses_another_live_engine(
    isolated_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = EngineConfig(kv_capacity_tokens=4096)
    engine_state.save(engine_state.EngineState(
        kind="vllm", pid=os.getpid(), descendants=(), endpoints=Endpoints("http://x", None, None),
        launch_command=None, log_path=None, config=other.model_dump(mode="json"),
    ))  # fmt: skip
    sw = parse_sweep({"name": "s", "matrix": {"engine.kv_capacity_tokens": [2048]}}, "s.yaml")
    with pytest.raises(EngineError, match=r"another configuration is up \(pid"):
        sweep_mod.preflight(sw)
    # its own configuration is served by it: no checks, nothing started
    same = parse_sweep({"name": "s", "matrix": {"engine.kv_capacity_tokens": [4096]}}, "s.yaml")
    sweep_mod.preflight(same)


# --- emptying the prefix cache between points ---------------------------------------------------


def test_reset_retries_until_vllm_says_success(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    answers = iter([{"success": False}, {"success": True}])
    urls: list[str] = []

    def post(url: str, **_: Any) -> httpx.Response:
        urls.append(url)
        return httpx.Response(200, json=next(answers))

    from kvscope.engines import make_engine, runtime

    monkeypatch.setattr(runtime.httpx, "post", post)
    monkeypatch.setattr(runtime.time, "sleep", lambda _: None)
    cfg = EngineConfig(port=8200, kv_events_port=5700)
    assert reset_prefix_cache(cfg) is None
    assert urls == ["http://127.0.0.1:8200/reset_prefix_cache"] * 2
    monkeypatch.setattr(runtime.httpx, "post", lambda url, **_: httpx.Response(400, text="busy"))
    with pytest.raises(EngineError, match=r"could not empty the prefix cache .* HTTP 400 busy"):
        runtime.reset_cache(make_engine(cfg), "http://127.0.0.1:8200", attempts=2)
    note = reset_prefix_cache(EngineConfig(kind="attach", url="http://gpu:30000"))
    assert note is not None and "not reset" in note
    urls.clear()

    def missing(url: str, **_: Any) -> httpx.Response:  # vLLM without VLLM_SERVER_DEV_MODE
        urls.append(url)
        return httpx.Response(404, text="Not Found")

    monkeypatch.setattr(runtime.httpx, "post", missing)
    with pytest.raises(EngineError, match="answers 404: no reset endpoint"):
        runtime.reset_cache(make_engine(cfg), "http://127.0.0.1:8200", attempts=5)
    assert len(urls) == 1  # a missing route is final: not retried


# --- the command -------------------------------------------------------------------------------


def test_dry_run_lists_points_and_engines_without_starting_anything(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["sweep", str(ROOT / "configs" / "radix-off.yaml"), "--dry-run",
              "--runs-dir", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "radix-off: 2 points, 2 engine configuration(s)" in result.output
    assert "radix-off-prefix_cache=true" in result.output
    assert not (tmp_path / "sweeps").exists()


def test_a_bad_sweep_is_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: {}\nmatrix:\n  workload.concurrency: [0]\n")
    result = CliRunner().invoke(app, ["sweep", str(bad)])
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "concurrency=0" in lines[0]


def test_the_summary_table_tells_the_points_apart_at_a_narrow_width() -> None:
    from rich.console import Console

    from kvscope.cli import sweep as cli_sweep
    from kvscope.sweep.runner import PointResult, SweepRecord

    points = [
        PointResult(i, f"s-kv_capacity_tokens={c}-concurrency={n}", overrides, 0, status, **more)
        for i, (c, n, status, more) in enumerate(
            [
                (None, 1, "ok", {"hit_ratio": 0.5, "agent_hit_ratio": {"planner": 0.0}}),
                (2048, 2, "failed", {"error": "engine died"}),
            ]
        )
        for overrides in [{"engine.kv_capacity_tokens": c, "workload.concurrency": n}]
    ]
    record = SweepRecord(Path("sweep.json"), "s", "s.yaml", "done", "now", [], points)
    narrow = Console(width=80, record=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli_sweep, "console", narrow)
        cli_sweep._show(record)
    rows = [line for line in narrow.export_text().splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in r.split("│")[1:-1]] for r in rows]
    assert [c[:5] for c in cells[:2]] == [
        ["default", "1", "ok", "50.0%", "0.0%"],
        ["2048", "2", "failed", "null", "null"],  # not measured: null, not 0
    ]
    assert "engine" in cells[1][-1] and "died" in " ".join(c[-1] for c in cells[1:])
