"""Sweeps: a matrix of experiments (spec.py), run one engine per engine configuration
(runner.py)."""

from kvscope.sweep.runner import (
    DONE,
    FAILED,
    INTERRUPTED,
    NOT_RUN,
    OK,
    PENDING,
    RUNNING,
    SWEEP_JSON,
    PointResult,
    SweepHooks,
    SweepRecord,
    group_engine,
    new_sweep_dir,
    reset_prefix_cache,
    run_sweep,
)
from kvscope.sweep.spec import (
    Group,
    Point,
    Sweep,
    apply,
    expand,
    load_sweep,
    parse_sweep,
    point_label,
    preflight,
)

__all__ = [
    "DONE", "FAILED", "INTERRUPTED", "NOT_RUN", "OK", "PENDING", "RUNNING", "SWEEP_JSON",
    "Group", "Point", "PointResult", "Sweep", "SweepHooks", "SweepRecord", "apply", "expand",
    "group_engine", "load_sweep", "new_sweep_dir", "parse_sweep", "point_label", "preflight",
    "reset_prefix_cache", "run_sweep",
]  # fmt: skip
