"""`kvscope run`: the configured workflows, end to end, through the one pipeline (pipeline.py).

    check_experiment(cfg)                  # a bad config refused before any engine starts
    pipeline.run(cfg, drive, hooks, plan)  # capture -> drive -> finalize -> analyze -> publish

The driver is the only step that knows PEER, and it knows it as an app: the PEER graph calls
the engine with the OpenAI SDK like any app, and `session.intercept()` turns each of those calls
into a row, named from LangGraph's run context; any app run inside the same session leaves the
same run directory. What was measured is kept whatever happens (pipeline.py).
"""

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

from kvscope import pipeline
from kvscope.capture import CaptureSession, Hooks
from kvscope.config import ExperimentConfig, check_experiment
from kvscope.engines import auth
from kvscope.engines.base import Engine
from kvscope.errors import ConfigError
from kvscope.publish import RunOutcome, WorkloadOutcome
from kvscope.workload import driver

__all__ = ["Hooks", "RunOutcome", "drive", "run_experiment"]


def run_experiment(cfg: ExperimentConfig, hooks: Hooks | None = None) -> RunOutcome:
    hooks = hooks or Hooks()
    check_experiment(cfg)
    planned = WorkloadOutcome.of([], planned=cfg.workload.workflows)
    return pipeline.run(cfg, partial(drive, cfg=cfg, hooks=hooks), hooks, planned)


def drive(session: CaptureSession, cfg: ExperimentConfig, hooks: Hooks) -> WorkloadOutcome:
    """Run the configured workflows (PEER or supervisor) against the session's engine, every call
    intercepted."""
    assert session.base_url is not None and session.model is not None
    hooks.on_stage("running workflows")
    tokenizer = _tokenizer(session.engine) if cfg.workload.mode == "synthetic" else None
    with session.intercept():
        results = asyncio.run(
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
    return WorkloadOutcome.of(results, planned=cfg.workload.workflows)


def _tokenizer(engine: Engine) -> Any:
    """The model's tokenizer, which synthetic prompts are measured in."""
    from tokenizers import Tokenizer

    path = Path(engine.model_facts().get("path", "")) / "tokenizer.json"
    if not path.exists():
        raise ConfigError(f"synthetic mode needs {path}")
    return Tokenizer.from_file(str(path))
