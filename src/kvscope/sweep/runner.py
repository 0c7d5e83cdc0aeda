"""Running a sweep: one engine per group of points, one `kvscope run` per point, sweep.json.

Each group's engine starts once, serves the group's points (its prefix cache emptied before
each one, so that no point inherits another's cache), then stops. Each point is one run
directory and one MLflow run (with `replay: true`, each finished run is also replayed under its
engine's policies at its capacity: RUN/replay.json, which the compare report sets beside it);
`sweep.json` in the sweep's directory records every point's status and run directory as the
sweep goes, and a failed point does not stop the sweep.
"""

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kvscope.config import EngineConfig, ExperimentConfig, config_hash
from kvscope.engines import make_engine
from kvscope.engines import state as engine_state
from kvscope.engines.runtime import reset_cache, reusable, start, state_of
from kvscope.records.run_dir import REPLAY_JSON
from kvscope.sweep.spec import Group, Point, Sweep

SWEEP_JSON = "sweep.json"
SWEEPS_DIR = "sweeps"  # under the base's runs_dir

PENDING, RUNNING, OK, FAILED, INTERRUPTED, NOT_RUN = (
    "pending", "running", "ok", "failed", "interrupted", "not run",
)  # fmt: skip
DONE = "done"  # the sweep's own status: running | done | interrupted | failed


class Outcome(Protocol):
    """What the sweep reads from a run (kvscope.publish.RunOutcome)."""

    mlflow_run_id: str | None
    error: str | None

    @property
    def benchmark_run_id(self) -> str: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def analysis(self) -> Any: ...  # RunAnalysis: agents, total

    @property
    def workload(self) -> Any: ...  # WorkloadOutcome: failed


RunPoint = Callable[[ExperimentConfig, Any], Outcome]
EngineStarter = Callable[[EngineConfig, Path], AbstractContextManager[object]]
CacheReset = Callable[[EngineConfig], str | None]
Replayer = Callable[[Path], object]  # kvscope.replaying.replay_run
Steps = tuple[RunPoint, CacheReset | None, Replayer | None]  # a point: run, reset before, replay


@dataclass
class PointResult:
    index: int
    label: str
    overrides: dict[str, Any]
    engine_group: int
    status: str = PENDING
    run_dir: str | None = None
    benchmark_run_id: str | None = None
    mlflow_run_id: str | None = None
    error: str | None = None
    seconds: float | None = None
    workflows_failed: int | None = None
    hit_ratio: float | None = None  # weighted, all agents
    agent_hit_ratio: dict[str, float | None] = field(default_factory=dict)
    note: str | None = None
    replay: str | None = None  # RUN/replay.json when the sweep replays its points


@dataclass
class SweepHooks:
    """Progress callbacks (all optional); `run_hooks` are handed to each run."""

    on_point: Callable[[Point], None] = lambda _: None
    on_point_done: Callable[[PointResult], None] = lambda _: None
    on_stage: Callable[[str], None] = lambda _: None
    run_hooks: Any = None  # kvscope.capture.Hooks


@dataclass
class SweepRecord:
    """sweep.json: rewritten whenever a point changes state."""

    path: Path
    sweep: str
    source: str
    status: str
    started_at: str
    groups: list[dict[str, Any]]
    points: list[PointResult]
    finished_at: str | None = None
    compare_report: str | None = None

    @classmethod
    def new(cls, sweep: Sweep, out_dir: Path) -> "SweepRecord":
        groups = sweep.groups()
        where = {p.index: g.index for g in groups for p in g.points}
        return cls(
            path=out_dir / SWEEP_JSON,
            sweep=sweep.name,
            source=sweep.source,
            status=RUNNING,
            started_at=_now(),
            groups=[
                {
                    "index": g.index,
                    "engine_hash": config_hash(g.engine),
                    "engine": g.engine.model_dump(mode="json"),
                    "points": [p.index for p in g.points],
                }
                for g in groups
            ],
            points=[
                PointResult(p.index, p.label, p.overrides, where[p.index]) for p in sweep.points
            ],
        )

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.points:
            out[p.status] = out.get(p.status, 0) + 1
        return out

    def write(self) -> None:
        doc = {
            "sweep": self.sweep,
            "source": self.source,
            "status": self.status,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "counts": self.counts(),
            "compare_report": self.compare_report,
            "groups": self.groups,
            "points": [asdict(p) for p in self.points],
        }
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2, default=str))
        os.replace(tmp, self.path)


def new_sweep_dir(sweep: Sweep) -> Path:
    base = sweep.runs_dir.resolve() / SWEEPS_DIR
    path = base / f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = base / f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
    path.mkdir(parents=True)
    return path


def run_sweep(
    sweep: Sweep,
    out_dir: Path,
    *,
    hooks: SweepHooks | None = None,
    start_engine: EngineStarter | None = None,
    run_point: RunPoint | None = None,
    reset_cache: CacheReset | None = None,
    replay: Replayer | None = None,
) -> SweepRecord:
    """Run every point, one engine per group; a failed point is recorded and the sweep goes on.

    Ctrl-C (or SIGTERM): the running point keeps what it measured, the group's engine is
    stopped, the remaining points are recorded as not run, and the interrupt propagates.
    `replay` (default kvscope.replaying.replay_run) runs after each finished point when the
    sweep says `replay: true`; its failure is the point's note, not its failure.
    """
    hooks = hooks or SweepHooks()
    if sweep.replay and replay is None:
        from kvscope.replaying import replay_run

        replay = replay_run
    elif not sweep.replay:
        replay = None
    start_engine = start_engine or group_engine
    reset_cache = reset_cache or reset_prefix_cache
    if run_point is None:
        from kvscope.experiment import run_experiment

        run_point = run_experiment
    record = SweepRecord.new(sweep, out_dir)
    record.write()
    try:
        groups = sweep.groups()
        for group in groups:
            hooks.on_stage(f"starting {group.engine.kind} (engine {group.index + 1}/{len(groups)})")
            steps = (run_point, reset_cache, replay)
            _run_group(group, out_dir, record, hooks, start_engine, steps)
        record.status = DONE
    except (KeyboardInterrupt, SystemExit):
        record.status = INTERRUPTED
        raise
    except BaseException:
        record.status = FAILED  # a bug, not a point's failure: those are recorded and passed
        raise
    finally:
        for p in record.points:
            if p.status in (PENDING, RUNNING):
                p.status = NOT_RUN
        record.finished_at = _now()
        record.write()
    return record


def _run_group(
    group: Group,
    out_dir: Path,
    record: SweepRecord,
    hooks: SweepHooks,
    start_engine: EngineStarter,
    steps: Steps,
) -> None:
    try:
        if group.deployed:  # the point's run starts its replicas and router, and empties them
            for point in group.points:
                _run_point(point, record, hooks, (steps[0], None, steps[2]))
            return
        with start_engine(group.engine, out_dir / f"engine-{group.index}.log"):
            for point in group.points:
                _run_point(point, record, hooks, steps)
    except Exception as err:  # the engine did not start (or did not stop): not the points' fault
        for point in group.points:
            result = record.points[point.index]
            if result.status == PENDING:
                result.status, result.error = FAILED, f"engine: {_message(err)}"
                hooks.on_point_done(result)
        record.write()


def _run_point(point: Point, record: SweepRecord, hooks: SweepHooks, steps: Steps) -> None:
    run_point, reset_cache, replay = steps
    result = record.points[point.index]
    result.status = RUNNING
    record.write()
    hooks.on_point(point)
    runs_dir = point.config.runs_dir.resolve()
    before = _run_dirs(runs_dir, point.label)
    t0 = time.monotonic()
    try:
        if reset_cache is not None:
            hooks.on_stage("emptying the prefix cache")
            result.note = reset_cache(point.config.engine)
        outcome = run_point(point.config, hooks.run_hooks)
    except Exception as err:
        result.status, result.error = FAILED, _message(err)
        result.run_dir = _new_run_dir(runs_dir, point.label, before)
    except BaseException:
        result.status = INTERRUPTED
        result.run_dir = _new_run_dir(runs_dir, point.label, before)
        raise
    else:
        result.status = OK if outcome.error is None else FAILED
        result.error = outcome.error
        result.run_dir = str(outcome.run_dir)
        result.benchmark_run_id = outcome.benchmark_run_id
        result.mlflow_run_id = outcome.mlflow_run_id
        result.workflows_failed = outcome.workload.failed
        result.hit_ratio = outcome.analysis.total.weighted_hit_ratio
        result.agent_hit_ratio = {a.agent_id: a.weighted_hit_ratio for a in outcome.analysis.agents}
        if replay is not None and result.status == OK:
            _replay(result, replay, hooks)
    finally:
        result.seconds = round(time.monotonic() - t0, 2)
        record.write()
        if result.status != RUNNING:
            hooks.on_point_done(result)


def _replay(result: PointResult, replay: Replayer, hooks: SweepHooks) -> None:
    """Replay a finished point's run; a failure is said in its note."""
    assert result.run_dir is not None
    hooks.on_stage("replaying")
    try:
        replay(Path(result.run_dir))
    except Exception as err:
        why = f"replay failed: {_message(err)}"
        result.note = f"{result.note}; {why}" if result.note else why
    else:
        result.replay = str(Path(result.run_dir) / REPLAY_JSON)


def _run_dirs(runs_dir: Path, label: str) -> set[str]:
    if not runs_dir.is_dir():
        return set()
    return {p.name for p in runs_dir.iterdir() if p.name.startswith(f"{label}-")}


def _new_run_dir(runs_dir: Path, label: str, before: set[str]) -> str | None:
    """The run directory a failed point created (run_experiment makes it before starting)."""
    new = sorted(_run_dirs(runs_dir, label) - before)
    return str(runs_dir / new[-1]) if new else None


def _message(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}".rstrip(": ")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --- the engine of a group -------------------------------------------------------------------


@contextlib.contextmanager
def group_engine(cfg: EngineConfig, log_path: Path) -> Iterator[object]:
    """The engine for one group of points, as `kvscope engine up` would leave it, then stopped.

    Recording it in kvscope's engine state is what lets each point's run (`running()` in
    kvscope.engines.runtime) reuse it instead of starting its own; `kvscope engine status`
    shows it meanwhile. An engine that `engine up` already left with this exact configuration
    is used as it is and left running.
    """
    engine = make_engine(cfg)
    if reusable(engine) is not None:
        yield None
        return
    handle = start(engine, log_path)
    proc = handle.process
    try:
        if proc is not None:
            engine_state.save(state_of(handle, log_path))
        yield handle
    finally:
        try:
            if proc is not None:
                st = engine_state.load()
                if st is not None and st.pid == proc.pid:
                    engine_state.clear()
        finally:
            handle.stop()


def reset_prefix_cache(cfg: EngineConfig) -> str | None:
    """Empty the engine's prefix cache, so that a point starts cold; a note when it cannot."""
    engine = make_engine(cfg)
    return reset_cache(engine, engine.endpoints().base_url)
