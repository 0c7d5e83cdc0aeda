"""One run, whatever drives it: capture -> drive -> finalize -> analyze -> publish.

    with Pipeline(cfg, hooks) as run:          # engine, collectors, MLflow run, run directory
        run.workload = drive(run.session)      # the driver's one job: make the calls
    run.outcome                                # tables, status, analysis, report, MLflow

Every entry point is this pipeline with its own driver, and nothing else:
- `kvscope run` and sweeps: experiment.run_experiment (the configured PEER / supervisor workflows);
- `kvscope profile -- PROGRAM`: profiling.profile_program (a program in a child process);
- `kvscope.profile()`: profiling.Profile (the user's own `with` block);
- `kvscope replay --live`: live.run.replay_live (a source's calls sent again).

What was measured is kept whatever happens: an exception or Ctrl-C in the driver (or a failure
the driver reports in `run.failure` without raising, like a program's exit status) still gets
the tables, the summary and the MLflow run, marked with the failure; the exception then goes on
(`run` keeps an ordinary exception in the outcome instead), with a note where the run could not
be concluded either (its MLflow run is then ended FAILED, never left open). A session that fails
before it measured anything (no run directory streams yet) has nothing to keep: its error goes on
as is.
"""

import contextlib
from collections.abc import Callable
from dataclasses import asdict
from types import TracebackType

from kvscope.capture import CaptureSession, Hooks
from kvscope.config import ExperimentConfig
from kvscope.publish import RunOutcome, WorkloadOutcome, publish
from kvscope.records.run_dir import RunDir
from kvscope.records.status import RunStatus, write_status
from kvscope.trace_job import TraceJob

Driver = Callable[[CaptureSession], WorkloadOutcome]  # makes the calls while the session is open


class Pipeline:
    """One run from open to outcome (see the module docstring). `outcome` is set on exit."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        hooks: Hooks | None = None,
        workload: WorkloadOutcome | None = None,
    ) -> None:
        self.session = CaptureSession(cfg, hooks)
        self.hooks = self.session.hooks
        self.workload = workload or WorkloadOutcome()  # what the driver knows; set it by driving
        self.failure: BaseException | None = None  # a failure the driver reports, not raises
        self.outcome: RunOutcome | None = None

    def __enter__(self) -> "Pipeline":
        try:
            self.session.open()
        except BaseException as err:
            if self.session.measuring:  # the run directory has streams: keep them
                self._conclude_after(err)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.session.close()
        if exc is None:
            self._conclude(self.failure)
        else:
            self._conclude_after(exc)

    def _conclude_after(self, err: BaseException) -> None:
        """`_conclude` of a run that failed with `err`, which stays the error to report: a
        failure to conclude is added to its notes."""
        try:
            self._conclude(err)
        except Exception as later:
            err.add_note(f"kvscope could not conclude the run either: {later!r}")

    def _conclude(self, failure: BaseException | None) -> None:
        """The closed session's run directory -> tables, status, analysis, report, MLflow."""
        # loaded now, not with the pipeline: a profiled app's process holds none of it (duckdb
        # and ~60 modules, ~7k objects its garbage collector would walk) while it runs
        from kvscope.analysis.run import analyze_run
        from kvscope.finalize import finalize

        session, on_stage = self.session, self.hooks.on_stage
        on_stage("writing the request table")
        job = self._trace_job()  # the traces: its imports beside finalize, then the writing
        try:  # beside the analysis, figures and report
            finalize(session.run_dir, session.exported_timings())
            if job is not None:
                job.go()
            run = RunDir.open(session.run_dir)  # finalized: opened once for status and analysis
            rows = run.requests.select(["status", "end_ns"]).to_pylist()
            death = session.engine_death
            status = RunStatus.of(
                rows,
                death=None if death is None else (death.at_ns, death.reason),
                failure=failure or session.write_error,
                planned=self.workload.planned,
                ran=self.workload.workflows,
            )
            write_status(run.path, status, workload=asdict(self.workload))  # run.json: read after
            analysis = analyze_run(run)
        except BaseException:
            if job is not None:
                job.cancel()
            if session.tracking is not None and session.tracking.run_id:
                with contextlib.suppress(Exception):  # not left open for a publish to come
                    session.tracking.end("FAILED")
            raise
        self.outcome = publish(
            analysis,
            session.tracking,
            self.workload,
            failure=failure,
            traces=session.cfg.tracking.traces,
            on_stage=on_stage,
            offline=session.offline,
            trace_job=job,
        )

    def _trace_job(self) -> TraceJob | None:
        """The run's trace writer started in a child process now, told to go once the table is
        finalized (publish stops it where the run is not logged after all); None where there is
        no MLflow run to write to."""
        session, tracking = self.session, self.session.tracking
        if not session.cfg.tracking.traces or tracking is None or not tracking.run_id:
            return None
        if session.offline is not None:
            return None
        return TraceJob.start(
            session.run_dir,
            tracking.tracking_uri,
            tracking.experiment_id,
            tracking.run_id,
            go=False,
        )


def run(
    cfg: ExperimentConfig,
    drive: Driver,
    hooks: Hooks | None = None,
    planned: WorkloadOutcome | None = None,
) -> RunOutcome:
    """Open, drive, conclude: the run's outcome. `planned`: what the driver is known to attempt
    (kept when it fails before it can say more). An ordinary exception of the driver is kept in
    the outcome (status `failed`); Ctrl-C and SIGTERM go on once the outcome is written."""
    pipeline = Pipeline(cfg, hooks, planned)
    try:
        with pipeline:
            pipeline.workload = drive(pipeline.session)
    except Exception:
        if pipeline.outcome is None:  # nothing was measured: nothing to keep
            raise
    assert pipeline.outcome is not None
    return pipeline.outcome
