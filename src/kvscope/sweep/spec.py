"""A sweep's spec: one base experiment, a matrix of changes, and the points they expand to.

A sweep file is YAML:

    name: pressure                  # default: the file's name
    base: {...}                     # an experiment config (as for `kvscope run`), or a path to one
    matrix:                         # dotted path -> values; the points are the cartesian product
      engine.kv_capacity_tokens: [null, 4096, 2048]
      workload.concurrency: [1, 4]
    points:                         # optional: explicit points, after the matrix's
      - {workload.layout: role-first, workload.sharing: system}
    replay: true                    # optional: replay each finished run (RUN/replay.json)

Every point is validated before anything starts; points that share an engine configuration form
a group (one engine process; kvscope.sweep.runner runs them).
"""

import copy
import hashlib
import itertools
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvscope.config import (
    EngineConfig,
    ExperimentConfig,
    check_experiment,
    config_hash,
    load_yaml,
    one_line,
    parse_experiment,
)
from kvscope.engines import make_engine
from kvscope.engines import state as engine_state
from kvscope.engines.runtime import reusable
from kvscope.errors import ConfigError, EngineError

# Paths a point may not change: they belong to the sweep as a whole.
SWEEP_WIDE = ("name", "runs_dir", "tracking")


class SweepFile(BaseModel):
    """The YAML file, before expansion."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    base: dict[str, Any] | str = Field(default_factory=dict)
    matrix: dict[str, list[Any]] = Field(default_factory=dict)
    points: list[dict[str, Any]] = Field(default_factory=list)
    replay: bool = False


@dataclass(frozen=True)
class Point:
    index: int
    label: str  # the run's name: <sweep>-<key=value>-...
    overrides: dict[str, Any]
    config: ExperimentConfig


@dataclass(frozen=True)
class Group:
    """Points that share one engine configuration, hence one engine process; or one point with
    a deployment (replicas behind a router), which its own run starts and stops."""

    index: int
    engine: EngineConfig
    points: tuple[Point, ...]

    @property
    def deployed(self) -> bool:
        return self.points[0].config.deployment is not None


@dataclass(frozen=True)
class Sweep:
    name: str
    source: str
    points: tuple[Point, ...]
    replay: bool = False  # replay each finished run under its engine's policies at its capacity

    @property
    def runs_dir(self) -> Path:
        return self.points[0].config.runs_dir

    def groups(self) -> list[Group]:
        by_engine: dict[str, list[Point]] = {}
        engines: dict[str, EngineConfig] = {}
        for p in self.points:
            key = config_hash(p.config.engine)
            if p.config.deployment is not None:  # its own: the run starts its deployment
                key = f"{key}-point-{p.index}"
            by_engine.setdefault(key, []).append(p)
            engines.setdefault(key, p.config.engine)
        return [
            Group(i, engines[key], tuple(points))
            for i, (key, points) in enumerate(by_engine.items())
        ]


# --- loading -------------------------------------------------------------------------------


def load_sweep(path: Path, **overrides: Any) -> Sweep:
    """Read, expand and validate a sweep file. `overrides`: runs_dir / tracking_uri for all."""
    return parse_sweep(load_yaml(path), str(path), path.parent, **overrides)


def parse_sweep(
    data: dict[str, Any],
    source: str,
    base_dir: Path = Path("."),
    *,
    runs_dir: Path | None = None,
    tracking_uri: str | None = None,
) -> Sweep:
    try:
        spec = SweepFile.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {one_line(err, 'sweep')}") from None
    name = spec.name or Path(source).stem
    base = _base(spec.base, source, base_dir)
    if runs_dir is not None:
        base["runs_dir"] = str(runs_dir)
    if tracking_uri is not None:
        base["tracking"] = {**(base.get("tracking") or {}), "tracking_uri": tracking_uri}
    changes = expand(spec.matrix, spec.points, source)
    points: list[Point] = []
    seen: dict[str, str] = {}
    for i, change in enumerate(changes):
        label = point_label(name, change)
        cfg = parse_experiment(
            apply(base, {**change, "name": label}, source), f"{source}: point {label}"
        )
        _check_experiment(cfg, f"{source}: point {label}")
        key = config_hash(cfg.model_copy(update={"name": name}))
        if key in seen:
            raise ConfigError(f"{source}: points {seen[key]} and {label} are the same experiment")
        seen[key] = label
        points.append(Point(i, label, change, cfg))
    return Sweep(name, source, tuple(points), spec.replay)


def _base(base: dict[str, Any] | str, source: str, base_dir: Path) -> dict[str, Any]:
    if isinstance(base, str):
        return load_yaml((base_dir / base) if not Path(base).is_absolute() else Path(base))
    return copy.deepcopy(base)


def expand(
    matrix: dict[str, list[Any]], points: Sequence[dict[str, Any]], source: str = "sweep"
) -> list[dict[str, Any]]:
    """The matrix's cartesian product (first key slowest), then the explicit points."""
    for key, values in matrix.items():
        if not values:
            raise ConfigError(f"{source}: matrix {key}: needs at least one value")
    product = (
        [dict(zip(matrix, combo, strict=True)) for combo in itertools.product(*matrix.values())]
        if matrix
        else []
    )
    changes = [*product, *(dict(p) for p in points)]
    if not changes:
        raise ConfigError(f"{source}: a sweep needs a `matrix` or `points`")
    for change in changes:
        for key in change:
            if key.split(".")[0] in SWEEP_WIDE:
                raise ConfigError(
                    f"{source}: {key} is the same for the whole sweep: set it in `base`"
                )
    return changes


def apply(base: dict[str, Any], change: dict[str, Any], source: str = "sweep") -> dict[str, Any]:
    """A copy of `base` with each dotted path of `change` set."""
    out = copy.deepcopy(base)
    for path, value in change.items():
        keys = path.split(".")
        node = out
        for i, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                where = ".".join(keys[: i + 1])
                raise ConfigError(f"{source}: {path}: {where} is not a mapping")
            node = child
        node[keys[-1]] = copy.deepcopy(value)
    return out


_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+~-]+")
SHORT_JSON = 24  # a mapping or list whose JSON is longer is shortened in a label
_LEAF = 20  # the most characters of each leaf a shortened value shows


def point_label(sweep: str, change: dict[str, Any]) -> str:
    """`<sweep>-<key=value>-...`, keyed by each path's last part unless two would clash."""
    lasts = [k.split(".")[-1] for k in change]
    parts = [sweep]
    for key, value in change.items():
        short = key.split(".")[-1]
        name = short if lasts.count(short) == 1 else key
        parts.append(_UNSAFE.sub("_", f"{name}={short_value(value)}"))
    return "-".join(parts)


def short_value(value: Any) -> str:
    """A point's value as its label shows it: None "default", a bool lower case, a scalar as is;
    a mapping or list as its JSON, or, when that is longer than SHORT_JSON characters, its
    first two string leaves (in the order written) + "~" + the first 6 hex digits of the sha1
    of its sorted-key JSON, so that two different values never read the same:
    {workflow: supervisor, mode: tasks, workflows: 6, ...} -> "supervisor+tasks~" + 6 hex."""
    if value is None:
        return "default"
    if isinstance(value, bool):
        return str(value).lower()
    if not isinstance(value, dict | list):
        return str(value)
    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    if len(text) <= SHORT_JSON:
        return text
    leaves = list(_leaves(value))
    named = [v for v in leaves if isinstance(v, str)] or [short_value(v) for v in leaves]
    digest = hashlib.sha1(text.encode()).hexdigest()[:6]
    return "+".join(v[:_LEAF] for v in named[:2]) + "~" + digest


def _leaves(value: Any) -> Iterator[Any]:
    """The scalars inside a mapping or list, depth first, in the order written."""
    if isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _leaves(item)
    else:
        yield value


def _check_experiment(cfg: ExperimentConfig, source: str) -> None:
    """The checks `kvscope run` makes before starting (e.g. prompt lengths vs context)."""
    try:
        check_experiment(cfg)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def preflight(sweep: Sweep) -> None:
    """Engine checks before anything starts: installed, model, capacity, free ports.

    An engine that `kvscope engine up` left running serves the group with its exact
    configuration (and keeps running); any other live engine is refused, because the sweep
    records its own engines where `kvscope engine status/down` look.
    """
    up = engine_state.load()
    for group in sweep.groups():
        engine = make_engine(group.engine)
        if reusable(engine) is not None:
            continue
        if up is not None and up.alive():
            raise EngineError(
                f"an engine with another configuration is up (pid {up.pid}, "
                f"{up.endpoints.base_url}); `kvscope engine down` first"
            )
        engine.preflight()
