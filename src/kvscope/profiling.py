"""Profile a program of the user's own: `with kvscope.profile(...)` here, `kvscope profile -- ...`
for another process (cli/profile.py).

    with kvscope.profile(name="my-app", engine="configs/engine.yaml") as run:  # or attach=URL
        graph.invoke(inputs, {"configurable": {"thread_id": "t1"}})  # unmodified app code
    run.requests().to_pandas()       # one row per model call; run.outcome: the analysed run

On enter the engine is started (or reused, or attached to) and the collectors run exactly as for
`kvscope run`: cold prefix cache unless told otherwise, /metrics sampler, KV event listener, an
MLflow run. While the block is open, every call this process makes to the engine (OpenAI SDK,
sync or async, streamed or not; LangChain's ChatOpenAI; raw httpx) is one request row named by
LangGraph's run context (probe/intercept.py, probe/identity.py); OPENAI_BASE_URL, OPENAI_API_KEY
and KVSCOPE_MODEL point at the engine meanwhile (also `run.base_url`, `run.model`), so an app that
reads them needs no change. On exit the run directory is finalized, analysed and published like
`kvscope run`'s: the same tables, summary.json, report.html, MLflow run and traces.

An exception or Ctrl-C inside the block keeps what was measured and goes on. `async with` works
the same inside a running event loop; starting the engine and finalizing block the loop.
"""

import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

import pyarrow as pa

from kvscope.capture import Hooks
from kvscope.config import (
    AppConfig,
    EngineConfig,
    ExperimentConfig,
    HintPolicy,
    TrackingConfig,
    load_yaml,
    parse_engine,
    parse_experiment,
)
from kvscope.engines import auth
from kvscope.errors import ConfigError
from kvscope.pipeline import Pipeline
from kvscope.probe.child import MODEL_ENV
from kvscope.probe.intercept import Interceptor
from kvscope.publish import RunOutcome
from kvscope.records.requests import load_table

log = logging.getLogger(__name__)
GRACE_S = 10.0  # after a second Ctrl-C: how long a profiled program gets before it is killed


class ProgramFailed(Exception):
    """The profiled program ended with a non-zero status (the run is kept, marked FAILED)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"the program exited with status {code}")
        self.code = code


class ProfileOptions(TypedDict, total=False):
    """What a profile may change besides its engine (None or left out: the default)."""

    runs_dir: str | Path | None  # where run directories go
    tracking_uri: str | None  # MLflow tracking URI (default: SQLite under runs_dir)
    experiment: str | None  # the MLflow experiment
    cold_start: bool | None  # empty the prefix cache first (default: yes)
    traces: bool | None  # write MLflow traces
    store_prompts: bool  # keep each call's messages and serialized prompt text
    eviction_hints: HintPolicy | None  # each call's engine priority (SGLang; probe/hints.py)


def profile_config(
    name: str = "profile",
    engine: str | Path | EngineConfig | None = None,
    attach: str | None = None,
    *,
    command: tuple[str, ...] = (),
    **options: Unpack[ProfileOptions],
) -> ExperimentConfig:
    """The run's configuration. `engine`: an EngineConfig, or a YAML file holding an engine
    section's fields or a whole experiment config (its engine, tracking, runs_dir, cold_start
    and metrics_interval_s are used); `attach`: the base URL of a running OpenAI-compatible
    engine. Neither: the embedded engine, as `kvscope run` uses it. Keyword arguments override."""
    if engine is not None and attach is not None:
        raise ConfigError("profile: give engine or attach, not both")
    data: dict[str, Any] = {}
    if isinstance(engine, EngineConfig):
        data["engine"] = engine.model_dump(mode="json")
    elif engine is not None:
        loaded = load_yaml(Path(engine))
        if "engine" in loaded:  # an experiment config: its workload does not apply
            data = {k: v for k, v in loaded.items() if k not in ("workload", "name")}
        else:
            data["engine"] = parse_engine(loaded, str(engine)).model_dump(mode="json")
    if attach is not None:
        data["engine"] = {"kind": "attach", "url": attach}
    tracking = dict(data.get("tracking") or {})
    for key in ("tracking_uri", "experiment", "traces"):
        if options.get(key) is not None:
            tracking[key] = options[key]  # type: ignore[literal-required]
    data |= {
        "name": name,
        "tracking": TrackingConfig.model_validate(tracking).model_dump(mode="json"),
        "app": AppConfig(
            command=command, workflow_type=name, store_prompts=bool(options.get("store_prompts"))
        ).model_dump(mode="json"),
    }
    if (runs_dir := options.get("runs_dir")) is not None:
        data["runs_dir"] = str(runs_dir)
    if (cold_start := options.get("cold_start")) is not None:
        data["cold_start"] = cold_start
    if (hints := options.get("eviction_hints")) is not None:
        data["eviction_hints"] = hints
    return parse_experiment(data, str(engine) if engine else "profile")


class Profile:
    """One profiled stretch of a program: the pipeline (pipeline.py) whose driver is the code
    inside the block, every call of this process intercepted.

    `base_url`, `model`, `run_dir` and `run_id` are set once entered; `outcome` once exited."""

    def __init__(self, cfg: ExperimentConfig, hooks: Hooks | None = None) -> None:
        if cfg.app is None:
            raise ConfigError("profile needs an `app` section (profile_config makes one)")
        self.cfg = cfg
        self.pipeline = Pipeline(cfg, hooks)
        self.session = self.pipeline.session
        self.hooks = self.session.hooks
        self.outcome: RunOutcome | None = None
        self._interceptor: Interceptor | None = None
        self._saved_env: dict[str, str | None] = {}

    @property
    def base_url(self) -> str:
        return _known(self.session.base_url)

    @property
    def model(self) -> str:
        return _known(self.session.model)

    @property
    def run_dir(self) -> Path:
        return self.session.run_dir

    @property
    def run_id(self) -> str:
        return self.session.run_id

    def requests(self) -> pa.Table:
        """The run's request table (finalized once the block has exited)."""
        return load_table(self.run_dir)

    def __enter__(self) -> "Profile":
        self.pipeline.__enter__()
        try:
            self._interceptor = self.session.intercept().__enter__()
            self._set_env()
        except BaseException as err:
            self.pipeline.__exit__(type(err), err, err.__traceback__)
            raise
        self.hooks.on_stage("profiling")
        return self

    def __exit__(self, *exc_info: Any) -> None:  # (type, exception, traceback), as Pipeline's
        self._restore_env()
        if self._interceptor is not None:
            self._interceptor.__exit__(None, None, None)
        self.pipeline.__exit__(*exc_info)
        self.outcome = self.pipeline.outcome

    async def __aenter__(self) -> "Profile":
        return self.__enter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        self.__exit__(*exc_info)

    def _set_env(self) -> None:
        values = {
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": auth.api_key(self.session.cfg.engine.api_key_env)
            or os.environ.get("OPENAI_API_KEY")
            or "EMPTY",
            MODEL_ENV: self.model,
        }
        for key, value in values.items():
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()


def profile(
    name: str = "profile",
    engine: str | Path | EngineConfig | None = None,
    attach: str | None = None,
    *,
    on_stage: Callable[[str], None] | None = None,
    **options: Unpack[ProfileOptions],
) -> Profile:
    """Profile the model calls made inside a `with` (or `async with`) block; see the module
    docstring. `on_stage` hears the steps (starting the engine, finalizing, ...); `options`:
    ProfileOptions."""
    cfg = profile_config(name, engine, attach, **options)
    stage = on_stage or (lambda text: log.info("kvscope: %s", text))
    return Profile(cfg, Hooks(on_stage=stage))


@dataclass(frozen=True)
class ProgramRun:
    """A profiled program's run: the pipeline's outcome, the program's exit status, and the
    engine URL it was given."""

    outcome: RunOutcome
    code: int
    base_url: str | None


def profile_program(
    cfg: ExperimentConfig, command: list[str], hooks: Hooks | None = None
) -> ProgramRun:
    """`kvscope profile -- PROGRAM`: the pipeline whose driver is a program run to its end as a
    child process, with kvscope's probe in every Python interpreter it starts and the engine in
    OPENAI_BASE_URL, OPENAI_API_KEY and KVSCOPE_MODEL (probe/child.py). Its stdout, stderr and
    exit status are its own; a non-zero status or Ctrl-C is the run's failure (what was measured
    is kept)."""
    pipeline = Pipeline(cfg, hooks)
    code = 0
    with pipeline:
        session = pipeline.session
        env = {**os.environ, **session.child_env()}
        pipeline.hooks.on_stage(
            f"running {' '.join(command)} (engine {session.base_url}, model {session.model})"
        )
        code, pipeline.failure = run_program(command, env)
        if code and pipeline.failure is None:
            pipeline.failure = ProgramFailed(code)
    assert pipeline.outcome is not None
    return ProgramRun(pipeline.outcome, code, pipeline.session.base_url)


def run_program(command: list[str], env: dict[str, str]) -> tuple[int, BaseException | None]:
    """Run the program to its end; (its exit status, the interruption if there was one). Ctrl-C
    reaches the program (it shares the terminal's process group) and kvscope waits for it to end;
    a second Ctrl-C stops it (terminate, then kill after GRACE_S)."""
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as err:
        raise ConfigError(f"cannot run {command[0]}: {err.strerror or err}") from None
    interrupted: BaseException | None = None
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt as err:  # the program got the same SIGINT: let it end
            if interrupted is not None:  # a second Ctrl-C: stop it
                proc.terminate()
                try:
                    code = proc.wait(GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    code = proc.wait()
                break
            interrupted = err
    if code < 0:  # killed by a signal: the shell's convention, 128 + the signal
        sig, code = -code, 128 - code
        if sig == signal.SIGINT and interrupted is None:
            interrupted = KeyboardInterrupt()
    return code, interrupted


def _known(value: str | None) -> str:
    if value is None:
        raise RuntimeError("the profile is not open yet")
    return value
