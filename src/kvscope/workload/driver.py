"""The driver: cfg.workflows PEER workflows, at most cfg.concurrency at once, each one trace."""

import asyncio
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvscope.config import WorkloadConfig
from kvscope.errors import ConfigError
from kvscope.workload.peer import OnCall, PeerAgents, build_graph, cycle_bound, initial_state
from kvscope.workload.runtime import AgentRuntime
from kvscope.workload.synthetic import SyntheticPrompts
from kvscope.workload.taskset import Problem, TaskSet, load_tasks

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class WorkflowResult:
    thread_id: str
    workflow_run_id: str
    task_id: str | None
    cycles: int
    calls: int
    unparsed_verdicts: int
    failed_agent: str | None
    ok: bool


def assign_tasks(tasks: TaskSet, workflows: int, seed: int) -> list[Problem]:
    """Round-robin over a seeded shuffle of the task set: workflow i gets order[i % n]."""
    order = list(tasks.problems)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(workflows)]


def thread_id_for(benchmark_run_id: str, index: int) -> str:
    return f"{benchmark_run_id}-t{index:03d}"


async def run_workflows(
    runtime: AgentRuntime,
    cfg: WorkloadConfig,
    benchmark_run_id: str,
    *,
    tasks: TaskSet | None = None,
    tokenizer: "Tokenizer | None" = None,
    on_call: OnCall | None = None,
    on_workflow_done: Callable[[WorkflowResult], None] | None = None,
) -> list[WorkflowResult]:
    """Run cfg.workflows PEER workflows, at most cfg.concurrency at once; results in index order.

    A failed LLM call ends only its own workflow. An exception (a bug, not a failed call)
    cancels the others and propagates.
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
    graph = build_graph(PeerAgents(runtime, cfg, tasks=tasks, synthetic=synthetic, on_call=on_call))
    # Each cycle is 4 LangGraph steps; the slack only guards against a routing bug looping.
    recursion_limit = 4 * cycle_bound(cfg) + 8
    gate = asyncio.Semaphore(cfg.concurrency)
    results: list[WorkflowResult | None] = [None] * cfg.workflows

    async def one(index: int) -> None:
        async with gate:
            thread_id = thread_id_for(benchmark_run_id, index)
            workflow_run_id = str(uuid.uuid4())
            state = initial_state(
                benchmark_run_id, thread_id, workflow_run_id, index, problems[index]
            )
            with runtime.workflow_span(benchmark_run_id, thread_id, workflow_run_id):
                final = await graph.ainvoke(
                    state,
                    {"configurable": {"thread_id": thread_id}, "recursion_limit": recursion_limit},
                )
        result = WorkflowResult(
            thread_id=thread_id,
            workflow_run_id=workflow_run_id,
            task_id=final["task_id"],
            cycles=final["cycles"],
            calls=final["calls"],
            unparsed_verdicts=final["unparsed_verdicts"],
            failed_agent=final["failed_agent"],
            ok=final["failed_agent"] is None,
        )
        results[index] = result
        if on_workflow_done is not None:
            on_workflow_done(result)

    async with asyncio.TaskGroup() as group:
        for index in range(cfg.workflows):
            group.create_task(one(index))
    return [r for r in results if r is not None]
