"""A supervisor workflow as an ordinary LangGraph app: a supervisor routes among N workers.

    START -> supervisor -(structured choice)-> researcher x k (Send fan-out) -> join -> supervisor
                                            -> analyst | writer | critic | ... -> supervisor
                                            -> finish: END

The supervisor's call is the routing decision: its reply is constrained by structured output to
one of the workers that have not worked yet, or `finish` (kvscope.workload.decisions), so it
parses every time and depends on the task and on the work done so far. The first `workers`
(3..6) of supervisor_prompts.WORKERS are the team. Choosing the researcher fans out with
LangGraph's `Send`: one parallel researcher call per (task document, focus), joined by `join`
(no model call) into the research notes the others see. Every worker goes back to the
supervisor. Bound: a route whose calls, plus the supervisor's next decision, would take the
workflow past `max_steps` calls ends it instead; so do `finish`, a failed call and a reply that
names no choice (counted in unparsed_verdicts; 0 with an engine that honours response_format).

As in peer.py, nodes call the model with the OpenAI SDK only; what they know about their prompts
rides on the nodes as `{"kvscope": {...}}` metadata.
"""

import operator
from typing import Annotated, Any, TypedDict

import openai
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

from kvscope.config import WorkloadConfig
from kvscope.workload import decisions
from kvscope.workload import supervisor_prompts as sp
from kvscope.workload.chat import Reply, stream_chat
from kvscope.workload.peer import METADATA_KEY, make_tools
from kvscope.workload.taskset import Problem, TaskSet

WORKFLOW_TYPE = "supervisor"
SUPERVISOR, FINISH, RESEARCHER = sp.SUPERVISOR, sp.FINISH, "researcher"
JOIN = "join"


def _first(a: str | None, b: str | None) -> str | None:
    """Reducer: the first value set wins (parallel branches may both fail)."""
    return a if a is not None else b


def _merge(a: dict[str, str], b: dict[str, str]) -> dict[str, str]:
    return {**a, **b}


class SupervisorState(TypedDict):
    workflow_index: int
    task_id: str | None
    work: Annotated[dict[str, str], _merge]  # each worker's latest output
    notes: Annotated[list[str], operator.add]  # the researcher branches' notes, until the join
    path: Annotated[list[str], operator.add]  # the agents called, in order
    calls: Annotated[int, operator.add]  # model calls made (updates are increments)
    cycles: int  # supervisor decisions made
    unparsed_verdicts: int  # decisions that named no choice
    route: str | None  # the latest decision: a worker or "finish"
    failed_agent: Annotated[str | None, _first]
    error_type: Annotated[str | None, _first]


class ResearchTask(TypedDict):
    """What one researcher branch of the fan-out gets (Send's argument)."""

    task_id: str
    document_id: str
    focus: str


def annotations() -> dict[str, Any]:
    return {
        METADATA_KEY: {
            "prompt_template_version": sp.TEMPLATE_VERSION,
            "layout": "shared-first",
            "fixed_messages": 1,
        }
    }


class SupervisorAgents:
    """The supervisor and worker node functions, bound to one client, configuration, task set."""

    def __init__(
        self, client: openai.AsyncOpenAI, model: str, cfg: WorkloadConfig, tasks: TaskSet
    ) -> None:
        self.client, self.model, self.cfg, self.tasks = client, model, cfg, tasks
        self.workers: tuple[str, ...] = sp.WORKERS[: cfg.workers]
        _, self.calculator_tool = make_tools(tasks)

    def fanout(self, problem: Problem) -> list[ResearchTask]:
        """The researcher's parallel branches for a task: one per (document, focus)."""
        return [
            ResearchTask(task_id=problem.id, document_id=d, focus=f)
            for d in problem.document_ids
            for f in sp.FOCUSES
        ]

    def cost(self, worker: str, problem: Problem) -> int:
        """The model calls choosing `worker` costs."""
        return len(self.fanout(problem)) if worker == RESEARCHER else 1

    async def supervisor(self, state: SupervisorState) -> dict[str, Any]:
        problem = self._problem(state["task_id"])
        work = state["work"]
        choices = (*[w for w in self.workers if w not in work], FINISH)
        messages = sp.supervisor_messages(
            self.tasks.documents_for(problem), problem.question, work, self.workers, choices
        )
        extra = {"response_format": decisions.choice_format(choices)}
        reply = await stream_chat(
            self.client, self.model, messages, decisions.ROUTE_MAX_TOKENS, extra
        )
        update = _called(SUPERVISOR, reply)
        if reply.content is None:
            return update
        choice = decisions.parse_choice(reply.content, choices)
        route = choice or FINISH
        calls = state["calls"] + 1
        if route != FINISH and calls + self.cost(route, problem) + 1 > self.cfg.max_steps:
            route = FINISH  # no room for the worker and the decision after it
        update.update(
            cycles=state["cycles"] + 1,
            unparsed_verdicts=state["unparsed_verdicts"] + int(choice is None),
            route=route,
        )
        return update

    async def researcher(self, task: ResearchTask) -> dict[str, Any]:
        problem = self._problem(task["task_id"])
        document = self.tasks.document(task["document_id"])
        messages = sp.researcher_messages(
            self.tasks.documents_for(problem), problem.question, document, task["focus"]
        )
        reply = await stream_chat(self.client, self.model, messages, self.cfg.max_tokens)
        update = _called(RESEARCHER, reply)
        if reply.content is not None:
            update["notes"] = [f"[{document.id}] {reply.content}"]
        return update

    async def join(self, state: SupervisorState) -> dict[str, Any]:
        """The fan-out's join: the branches' notes become the researcher's output."""
        return {"work": {RESEARCHER: " ".join(state["notes"])}}

    def worker(self, name: str) -> Any:
        """The node function of worker `name` (not the researcher)."""

        async def run(state: SupervisorState) -> dict[str, Any]:
            problem = self._problem(state["task_id"])
            tool_text = None
            if name == "analyst" and self.cfg.tool:
                tool_text = self.calculator_tool.invoke({"expression": problem.expression})
            messages = sp.worker_messages(
                name,
                self.tasks.documents_for(problem),
                problem.question,
                state["work"],
                self.workers,
                tool_text,
            )
            reply = await stream_chat(self.client, self.model, messages, self.cfg.max_tokens)
            update = _called(name, reply)
            if reply.content is not None:
                update["work"] = {name: reply.content}
            return update

        run.__name__ = name
        return run

    def _problem(self, task_id: str | None) -> Problem:
        assert task_id is not None
        return self.tasks.problem(task_id)


def _called(agent: str, reply: Reply) -> dict[str, Any]:
    update: dict[str, Any] = {"calls": 1, "path": [agent]}
    if reply.content is None:
        update.update(failed_agent=agent, error_type=reply.error_type)
    return update


def route_after_supervisor(state: SupervisorState, agents: SupervisorAgents) -> Any:
    """END, the chosen worker, or the researcher's fan-out (a list of Sends)."""
    route = state["route"]
    if state["failed_agent"] or route in (None, FINISH):
        return END
    if route == RESEARCHER:
        problem = agents._problem(state["task_id"])
        return [Send(RESEARCHER, task) for task in agents.fanout(problem)]
    return route


def route_after_worker(state: SupervisorState) -> str:
    return END if state["failed_agent"] else SUPERVISOR


def build_graph(agents: SupervisorAgents) -> CompiledStateGraph:
    """The compiled supervisor graph; every model-calling node carries the prompt annotations."""
    meta = annotations()
    graph = StateGraph(SupervisorState)
    graph.add_node(SUPERVISOR, agents.supervisor, metadata=meta)
    graph.add_node(RESEARCHER, agents.researcher, metadata=meta)
    graph.add_node(JOIN, agents.join)
    others = [w for w in agents.workers if w != RESEARCHER]
    for name in others:
        graph.add_node(name, agents.worker(name), metadata=meta)
        graph.add_conditional_edges(name, route_after_worker, [SUPERVISOR, END])
    graph.add_edge(START, SUPERVISOR)

    def after_supervisor(state: SupervisorState) -> Any:
        return route_after_supervisor(state, agents)

    graph.add_conditional_edges(SUPERVISOR, after_supervisor, [RESEARCHER, *others, END])
    graph.add_edge(RESEARCHER, JOIN)
    graph.add_conditional_edges(JOIN, route_after_worker, [SUPERVISOR, END])
    return graph.compile()


def initial_state(workflow_index: int, problem: Problem | None) -> SupervisorState:
    assert problem is not None, "the supervisor runs on the task set"
    return SupervisorState(
        workflow_index=workflow_index,
        task_id=problem.id,
        work={},
        notes=[],
        path=[],
        calls=0,
        cycles=0,
        unparsed_verdicts=0,
        route=None,
        failed_agent=None,
        error_type=None,
    )
