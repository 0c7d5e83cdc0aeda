"""The MLflow run of a capture session: opened where MLflow is loaded, kept local where it fails.

    mlrun = SessionRun(cfg, run_id, engine_name, on_stage, on_warning)
    mlrun.go_offline(why)            # a tracking server that does not answer: kept locally
    mlrun.open(params)               # now if this process has MLflow loaded, else deferred
    mlrun.log_params(more)           # to the open run, or with the deferred run's own
    mlrun.ensure()                   # a deferred run opened now (started when open() was called)
    mlrun.tracking, mlrun.offline    # the TrackingRun (None until open), why there is none

MLflow's package brings ~110k Python objects into a process (probe/mlflow_store.py). A process
that has not loaded it (an app profiled in its own process, `kvscope.profile()`, that does not
use MLflow) opens the run where the session closes, with the session's start as the run's start:
the app's full garbage collections do not walk MLflow meanwhile. A process that has (an app
tracing with MLflow itself: its traces link to the active run live) opens it at once.
"""

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvscope.config import ExperimentConfig

if TYPE_CHECKING:
    from kvscope.probe.tracing import TrackingRun


class SessionRun:
    def __init__(
        self,
        cfg: ExperimentConfig,
        run_id: str,
        engine_name: str,
        on_stage: Callable[[str], None],
        on_warning: Callable[[str], None],
    ) -> None:
        self.cfg, self.run_id, self.engine_name = cfg, run_id, engine_name
        self.on_stage, self.on_warning = on_stage, on_warning
        self.tracking: TrackingRun | None = None  # set once the MLflow run is open
        self.offline: str | None = None  # why there is no MLflow run (the run is kept locally)
        self._deferred: tuple[dict[str, Any], int] | None = None  # (params, start ms)

    def go_offline(self, why: str) -> None:
        self.offline = why
        self.on_warning(why)

    def open(self, params: dict[str, Any]) -> None:
        if self.offline is not None:
            return
        if "mlflow" in sys.modules:
            self._open(params)
        else:
            self._deferred = (dict(params), int(time.time() * 1000))

    def log_params(self, params: dict[str, Any]) -> None:
        if self._deferred is not None:
            self._deferred[0].update(params)
        elif self.tracking is not None and self.tracking.run_id is not None:
            self.tracking.log_params(params)

    def ensure(self) -> None:
        if self._deferred is None:
            return
        params, start_ms = self._deferred
        self._deferred = None
        self._open(params, start_ms)

    def _open(self, params: dict[str, Any], start_ms: int | None = None) -> None:
        from mlflow.exceptions import MlflowException

        from kvscope.probe.tracing import TrackingRun

        self.on_stage("opening the MLflow run")
        tags = {"benchmark_run_id": self.run_id, "engine": self.engine_name}
        try:
            tracking = TrackingRun.open(self.cfg.tracking, self.cfg.runs_dir.resolve())
            tracking.start(self.run_id, params, tags, start_ms)
        except MlflowException as err:
            self.go_offline(f"MLflow could not open the run ({err}); kept locally")
            return
        self.tracking = tracking
