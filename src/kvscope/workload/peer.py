"""KVFlow's PEER workflow in LangGraph (kvscope.workload.driver runs many of them at once).

Planner -> Executor -> Expresser -> Reviewer -> (Planner | END)

Every node talks to the model and to tracing only through the AgentRuntime it is given
(kvscope.workload.runtime), so identifiers and measurements are the same for every agent.
"""

import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from kvscope.config import WorkloadConfig
from kvscope.records.requests import STATUS_OK
from kvscope.workload import prompts, sharing
from kvscope.workload.runtime import AgentRuntime, CallIds, LlmCall, LlmReply
from kvscope.workload.synthetic import SyntheticPrompts
from kvscope.workload.taskset import Problem, TaskSet
from kvscope.workload.tools import calculate, extract_expression, format_hits, lookup

if TYPE_CHECKING:
    pass

WORKFLOW_TYPE = "peer"
PLANNER, EXECUTOR, EXPRESSER, REVIEWER = prompts.AGENTS

OnCall = Callable[[CallIds, LlmReply], None]


class PeerState(TypedDict):
    benchmark_run_id: str
    thread_id: str
    workflow_run_id: str
    workflow_index: int
    task_id: str | None  # None in synthetic mode
    turn_id: int  # the PEER cycle of the latest call, from 1
    previous_agent_id: str | None  # the agent that ran last; None before the first call
    messages: Annotated[list[dict[str, str]], operator.add]  # transcript: question + replies
    turns: Annotated[list[sharing.Turn], operator.add]  # each call: asked + answered (branch)
    plan: str | None
    execution_result: str | None
    expression: str | None
    review: str | None
    cycles: int  # PEER cycles completed (Reviewer replies received)
    calls: int  # LLM calls made, failed ones included
    unparsed_verdicts: int  # Reviewer replies without VERDICT: DONE|REVISE
    verdict: str | None  # the latest parsed verdict
    done: bool  # the Reviewer's routing decision
    failed_agent: str | None
    failed_turn: int | None
    error_type: str | None


def cycle_bound(cfg: WorkloadConfig) -> int:
    return cfg.cycles if cfg.loop == "fixed" else cfg.max_cycles


def loop_done(cfg: WorkloadConfig, cycles: int, verdict: str | None) -> bool:
    """Whether the workflow ends after its `cycles`-th Reviewer reply.

    In model mode an unparseable verdict counts as REVISE, so a model that never says DONE
    runs to max_cycles instead of stopping early or crashing.
    """
    if cfg.loop == "fixed":
        return cycles >= cfg.cycles
    return verdict == "DONE" or cycles >= cfg.max_cycles


@dataclass(frozen=True)
class ToolOutputs:
    lookup: str
    calculator: str
    ms: float  # time inside the tool functions, span overhead excluded


class PeerAgents:
    """The four node functions, bound to one runtime, configuration and prompt source."""

    def __init__(
        self,
        runtime: AgentRuntime,
        cfg: WorkloadConfig,
        *,
        tasks: TaskSet | None = None,
        synthetic: SyntheticPrompts | None = None,
        on_call: OnCall | None = None,
    ) -> None:
        if (tasks is None) == (synthetic is None):
            raise ValueError("PeerAgents needs exactly one of tasks (tasks mode) or synthetic")
        self.runtime = runtime
        self.cfg = cfg
        self.tasks = tasks
        self.synthetic = synthetic
        self.on_call = on_call

    async def planner(self, state: PeerState) -> dict[str, Any]:
        turn = state["cycles"] + 1
        ids = self._ids(state, PLANNER, turn)
        with self.runtime.agent_span(ids):
            messages = self._messages(PLANNER, state, turn)
            reply = await self._llm(ids, messages)
        return self._update(ids, state, reply, "plan", messages)

    async def executor(self, state: PeerState) -> dict[str, Any]:
        ids = self._ids(state, EXECUTOR, state["turn_id"])
        with self.runtime.agent_span(ids):
            tools = self._run_tools(state)
            tool_text = f"{tools.calculator}\n{tools.lookup}" if tools else None
            messages = self._messages(EXECUTOR, state, ids.turn_id, tool_text=tool_text)
            reply = await self._llm(ids, messages, tool_ms=tools.ms if tools else None)
        update = self._update(ids, state, reply, "execution_result", messages)
        if reply.status == STATUS_OK and tools:
            # The calculator's value travels with the Executor's words to the Expresser.
            update["execution_result"] = f"{tools.calculator} | {update['execution_result']}"
        return update

    async def expresser(self, state: PeerState) -> dict[str, Any]:
        ids = self._ids(state, EXPRESSER, state["turn_id"])
        with self.runtime.agent_span(ids):
            messages = self._messages(EXPRESSER, state, ids.turn_id)
            reply = await self._llm(ids, messages)
        return self._update(ids, state, reply, "expression", messages)

    async def reviewer(self, state: PeerState) -> dict[str, Any]:
        ids = self._ids(state, REVIEWER, state["turn_id"])
        with self.runtime.agent_span(ids):
            messages = self._messages(REVIEWER, state, ids.turn_id)
            reply = await self._llm(ids, messages)
        update = self._update(ids, state, reply, "review", messages)
        if reply.status != STATUS_OK:
            return update
        verdict = prompts.parse_verdict(reply.content)
        cycles = ids.turn_id
        update.update(
            cycles=cycles,
            verdict=verdict,
            unparsed_verdicts=state["unparsed_verdicts"] + int(verdict is None),
            done=loop_done(self.cfg, cycles, verdict),
        )
        return update

    def _ids(self, state: PeerState, agent: str, turn: int) -> CallIds:
        return CallIds(
            benchmark_run_id=state["benchmark_run_id"],
            thread_id=state["thread_id"],
            workflow_run_id=state["workflow_run_id"],
            turn_id=turn,
            agent_id=agent,
            previous_agent_id=state["previous_agent_id"],
            graph_node=agent,
        )

    async def _llm(
        self,
        ids: CallIds,
        messages: list[dict[str, str]],
        *,
        tool_ms: float | None = None,
    ) -> LlmReply:
        if self.synthetic is not None:
            call = LlmCall(messages, ids, self.cfg.synthetic.output_tokens,
                           self.synthetic.prompt_info, tool_ms, ignore_eos=True)  # fmt: skip
        else:
            prompt = prompts.prompt_info(self.cfg.layout, self.cfg.sharing)
            call = LlmCall(messages, ids, self.cfg.max_tokens, prompt, tool_ms)
        reply = await self.runtime.llm(call)
        if self.on_call is not None:
            self.on_call(ids, reply)
        return reply

    def _messages(
        self, agent: str, state: PeerState, turn: int, *, tool_text: str | None = None
    ) -> list[dict[str, str]]:
        if self.synthetic is not None:
            return self.synthetic.messages(agent, state["workflow_index"], turn)
        problem = self._problem(state)
        assert self.tasks is not None
        view = prompts.StateView(
            plan=state["plan"],
            execution_result=state["execution_result"],
            expression=state["expression"],
            review=state["review"],
        )
        return sharing.messages(
            agent,
            documents=self.tasks.documents_for(problem),
            question=problem.question,
            state=view,
            cycle=turn,
            sharing=self.cfg.sharing,
            layout=self.cfg.layout,
            tool_text=tool_text,
            turns=state["turns"],
        )

    def _run_tools(self, state: PeerState) -> ToolOutputs | None:
        """Lookup + calculator for the Executor, each in its tool span; None when tools are off."""
        if not self.cfg.tool or self.synthetic is not None:
            return None
        assert self.tasks is not None
        problem = self._problem(state)
        docs = [(d.id, d.text) for d in self.tasks.documents_for(problem)]
        spent = 0.0
        with self.runtime.tool_span(
            "lookup", {"question": problem.question, "documents": list(problem.document_ids)}
        ) as span:
            start = time.perf_counter()
            hits = format_hits(lookup(problem.question, docs))
            spent += time.perf_counter() - start
            span.set_output(hits)
        # A 135M model rarely writes a parseable CALC: line; the task's own formula then keeps
        # the tool step real work, and the span says where the expression came from.
        expression, source = extract_expression(state["plan"]), "plan"
        if not expression:
            expression, source = problem.expression, "task"
        inputs = {"expression": expression, "source": source}
        with self.runtime.tool_span("calculator", inputs) as span:
            start = time.perf_counter()
            calc = calculate(expression).text
            spent += time.perf_counter() - start
            span.set_output(calc)
        return ToolOutputs(lookup=hits, calculator=calc, ms=spent * 1000.0)

    def _problem(self, state: PeerState) -> Problem:
        assert self.tasks is not None and state["task_id"] is not None
        return self.tasks.problem(state["task_id"])

    @staticmethod
    def _update(
        ids: CallIds, state: PeerState, reply: LlmReply, field: str, sent: list[dict[str, str]]
    ) -> dict[str, Any]:
        update: dict[str, Any] = {
            "previous_agent_id": ids.agent_id,
            "turn_id": ids.turn_id,
            "calls": state["calls"] + 1,
        }
        if reply.status != STATUS_OK:
            update.update(
                failed_agent=ids.agent_id, failed_turn=ids.turn_id, error_type=reply.error_type
            )
            return update
        content = reply.content or ""
        update[field] = content
        update["messages"] = [{"role": "assistant", "name": ids.agent_id, "content": content}]
        update["turns"] = [sharing.Turn(ids.turn_id, sent[-1]["content"], content)]
        return update


# Routers are named module-level functions: a lambda router breaks MLflow's span naming
# under ainvoke (see notes/mlflow-langgraph.md).
def route_after_planner(state: PeerState) -> str:
    return END if state["failed_agent"] else EXECUTOR


def route_after_executor(state: PeerState) -> str:
    return END if state["failed_agent"] else EXPRESSER


def route_after_expresser(state: PeerState) -> str:
    return END if state["failed_agent"] else REVIEWER


def route_after_reviewer(state: PeerState) -> str:
    return END if state["failed_agent"] or state["done"] else PLANNER


def build_graph(agents: PeerAgents) -> CompiledStateGraph:
    graph = StateGraph(PeerState)
    graph.add_node(PLANNER, agents.planner)
    graph.add_node(EXECUTOR, agents.executor)
    graph.add_node(EXPRESSER, agents.expresser)
    graph.add_node(REVIEWER, agents.reviewer)
    graph.add_edge(START, PLANNER)
    graph.add_conditional_edges(PLANNER, route_after_planner, [EXECUTOR, END])
    graph.add_conditional_edges(EXECUTOR, route_after_executor, [EXPRESSER, END])
    graph.add_conditional_edges(EXPRESSER, route_after_expresser, [REVIEWER, END])
    graph.add_conditional_edges(REVIEWER, route_after_reviewer, [PLANNER, END])
    return graph.compile()


def initial_state(
    benchmark_run_id: str,
    thread_id: str,
    workflow_run_id: str,
    workflow_index: int,
    problem: Problem | None,
) -> PeerState:
    return PeerState(
        benchmark_run_id=benchmark_run_id,
        thread_id=thread_id,
        workflow_run_id=workflow_run_id,
        workflow_index=workflow_index,
        task_id=problem.id if problem else None,
        turn_id=1,
        previous_agent_id=None,
        messages=[{"role": "user", "content": problem.question}] if problem else [],
        turns=[],
        plan=None,
        execution_result=None,
        expression=None,
        review=None,
        cycles=0,
        calls=0,
        unparsed_verdicts=0,
        verdict=None,
        done=False,
        failed_agent=None,
        failed_turn=None,
        error_type=None,
    )
