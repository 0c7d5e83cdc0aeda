"""The driver: cfg.workflows workflows (PEER or the supervisor, `workload.workflow`), at most
cfg.concurrency at once, one invocation each.

It is the app's own runner, not a profiler: it calls the engine at `base_url` (an OpenAI-compatible
`.../v1`) with one `AsyncOpenAI` client shared by all workflows, and invokes the graph once per
workflow with a thread id and a fresh root run id (LangChain's config `run_id`), which a profiler
reading LangGraph's run context takes as the workflow run id.
"""

import asyncio
import os
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import openai
from langchain_core.runnables import RunnableConfig

from kvscope.config import WorkloadConfig
from kvscope.errors import ConfigError
from kvscope.workload import peer, supervisor
from kvscope.workload.synthetic import SyntheticPrompts
from kvscope.workload.taskset import Problem, TaskSet, load_tasks

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class WorkflowResult:
    thread_id: str
    workflow_run_id: str
    task_id: str | None
    cycles: int  # PEER cycles; supervisor decisions
    calls: int
    unparsed_verdicts: int  # routing decisions that named no choice (0 with structured output)
    failed_agent: str | None
    ok: bool
    path: tuple[str, ...] = ()  # the agents called, in order (Send branches in task order)


def assign_tasks(tasks: TaskSet, workflows: int, seed: int) -> list[Problem]:
    """Round-robin over a seeded shuffle of the task set: workflow i gets order[i % n]."""
    order = list(tasks.problems)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(workflows)]


def thread_id_for(prefix: str, index: int) -> str:
    return f"{prefix}-t{index:03d}"


def client_for(
    base_url: str, cfg: WorkloadConfig, api_key: str | None = None
) -> openai.AsyncOpenAI:
    """The app's client: no retries (a failed call is the workflow's outcome), the configured
    timeout; the engine's API key (engines/auth.py), else any (a local engine takes any)."""
    key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=key, max_retries=0, timeout=cfg.request_timeout_s
    )


async def run_workflows(
    base_url: str,
    model: str,
    cfg: WorkloadConfig,
    *,
    thread_prefix: str = "peer",
    tasks: TaskSet | None = None,
    tokenizer: "Tokenizer | None" = None,
    client: openai.AsyncOpenAI | None = None,
    on_workflow_done: Callable[[WorkflowResult], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    api_key: str | None = None,
) -> list[WorkflowResult]:
    """Run cfg.workflows PEER workflows against `model` at `base_url`, at most cfg.concurrency at
    once; results in index order. Workflow i runs on thread `<thread_prefix>-t<i:03d>`.

    `client` replaces the default one (`client_for`), e.g. with another transport; it is not
    closed here. A failed LLM call ends only its own workflow. A workflow whose turn comes once
    `should_stop()` is true (the engine died) is not run: it has no result. An exception (a bug,
    not a failed call) cancels the others and propagates.
    """
    synthetic: SyntheticPrompts | None = None
    problems: Sequence[Problem | None]
    if cfg.mode == "synthetic":
        if tokenizer is None:
            raise ConfigError("workload.mode synthetic needs the model's tokenizer")
        synthetic = SyntheticPrompts(tokenizer, cfg.synthetic, seed=cfg.seed)
        tasks = None
        problems = [None] * cfg.workflows
    else:
        tasks = tasks if tasks is not None else load_tasks()
        if not tasks.problems:
            raise ConfigError("workload: the task set has no problems")
        problems = assign_tasks(tasks, cfg.workflows, cfg.seed)
    own = client is None
    api = client if client is not None else client_for(base_url, cfg, api_key)
    if cfg.workflow == "supervisor":
        assert tasks is not None
        graph = supervisor.build_graph(supervisor.SupervisorAgents(api, model, cfg, tasks))
        initial_state: Callable[[int, Problem | None], Any] = supervisor.initial_state
        # at most max_steps calls, each 1 step (a fan-out's branches share one, + its join)
        recursion_limit = 2 * cfg.max_steps + 8
    else:
        agents = peer.PeerAgents(api, model, cfg, tasks=tasks, synthetic=synthetic)
        graph = peer.build_graph(agents)
        initial_state = peer.initial_state
        # Each cycle is 4 LangGraph steps; the slack only guards against a routing bug looping.
        recursion_limit = 4 * peer.cycle_bound(cfg) + 8
    gate = asyncio.Semaphore(cfg.concurrency)
    results: list[WorkflowResult | None] = [None] * cfg.workflows

    async def one(index: int) -> None:
        async with gate:
            if should_stop is not None and should_stop():
                return
            thread_id = thread_id_for(thread_prefix, index)
            run_id = uuid.uuid4()
            config: RunnableConfig = {
                "configurable": {"thread_id": thread_id},
                "run_id": run_id,
                "recursion_limit": recursion_limit,
            }
            final = await graph.ainvoke(initial_state(index, problems[index]), config)
        result = WorkflowResult(
            thread_id=thread_id,
            workflow_run_id=str(run_id),
            task_id=final["task_id"],
            cycles=final["cycles"],
            calls=final["calls"],
            unparsed_verdicts=final["unparsed_verdicts"],
            failed_agent=final["failed_agent"],
            ok=final["failed_agent"] is None,
            path=tuple(final["path"]),
        )
        results[index] = result
        if on_workflow_done is not None:
            on_workflow_done(result)

    try:
        async with asyncio.TaskGroup() as group:
            for index in range(cfg.workflows):
                group.create_task(one(index))
    finally:
        if own:
            await api.close()
    return [r for r in results if r is not None]
