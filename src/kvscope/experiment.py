"""One configuration, end to end: capture -> finalize -> analyze -> publish.

    with CaptureSession(cfg) as session:        # engine, collectors, MLflow run, run directory
        results = drive(session)                # the PEER workflows, every call a request row
    finalize(session.run_dir)                   # streams -> tables
    analysis = analyze_run(session.run_dir)     # every analysis, once
    publish(analysis, session.tracking, ...)    # summary.json, report.html, MLflow

The workload step is the only one that knows PEER, and it knows it as an app: the PEER graph
calls the engine with the OpenAI SDK like any app, and `session.intercept()` turns each of those
calls into a row, named from LangGraph's run context; any app run inside the same block leaves
the same run directory. What was measured is
kept whatever happens: rows are on disk as each call ends, and the tables, the summary and the
MLflow run are written also after a failure or Ctrl-C.
"""

import asyncio
from pathlib import Path
from typing import Any

from kvscope.capture import CaptureSession, Hooks
from kvscope.config import ExperimentConfig, check_experiment
from kvscope.engines import auth
from kvscope.engines.base import Engine
from kvscope.errors import ConfigError
from kvscope.profiling import conclude
from kvscope.publish import RunOutcome, WorkloadOutcome
from kvscope.workload import driver

__all__ = ["Hooks", "RunOutcome", "drive", "run_experiment"]


def run_experiment(cfg: ExperimentConfig, hooks: Hooks | None = None) -> RunOutcome:
    hooks = hooks or Hooks()
    check_experiment(cfg)
    session = CaptureSession(cfg, hooks)
    results: list[driver.WorkflowResult] = []
    failure: BaseException | None = None
    try:
        with session:
            hooks.on_stage("running workflows")
            results = drive(session, cfg, hooks)
    except (Exception, KeyboardInterrupt, SystemExit) as err:  # SystemExit: SIGTERM
        if not session.measuring:  # nothing was measured yet: nothing to keep
            raise
        failure = err
    workload = WorkloadOutcome.of(results, planned=cfg.workload.workflows)
    outcome = conclude(session, workload, failure, hooks.on_stage)
    if isinstance(failure, KeyboardInterrupt | SystemExit):
        raise failure
    return outcome


def drive(
    session: CaptureSession, cfg: ExperimentConfig, hooks: Hooks
) -> list[driver.WorkflowResult]:
    """Run the configured workflows (PEER or supervisor) against the session's engine, every call
    intercepted."""
    assert session.base_url is not None and session.model is not None
    tokenizer = _tokenizer(session.engine) if cfg.workload.mode == "synthetic" else None
    with session.intercept():
        return asyncio.run(
            driver.run_workflows(
                session.base_url,
                session.model,
                cfg.workload,
                thread_prefix=session.run_id,
                tokenizer=tokenizer,
                on_workflow_done=lambda _: hooks.on_workflow_done(),
                should_stop=session.should_stop,
                api_key=auth.api_key(cfg.engine.api_key_env),
            )
        )


def _tokenizer(engine: Engine) -> Any:
    """The model's tokenizer, which synthetic prompts are measured in."""
    from tokenizers import Tokenizer

    path = Path(engine.model_facts().get("path", "")) / "tokenizer.json"
    if not path.exists():
        raise ConfigError(f"synthetic mode needs {path}")
    return Tokenizer.from_file(str(path))
