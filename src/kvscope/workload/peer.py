"""KVFlow's PEER workflow as an ordinary LangGraph app (kvscope.workload.driver runs many of them).

Planner -> Executor -> Expresser -> Reviewer -> (Planner | END)          loop: fixed | model
Planner -> Executor -> Expresser -> Reviewer -> (Planner | Executor | END)  loop: dynamic

In dynamic mode (PBKV's setting) the Reviewer's call is the routing decision: the same prompt with
its last instruction replaced by decisions.REVIEWER_ROUTE, and the reply constrained by structured
output to `planner` (revise the plan), `executor` (redo the work) or `end`
(kvscope.workload.decisions). It stays one call, one row, of the Reviewer. A route whose round
would take the workflow past `max_steps` calls ends it instead; a reply that names no choice
(an engine that ignores response_format) is counted in unparsed_verdicts and ends the workflow.

Each node calls the model with the OpenAI SDK's `AsyncOpenAI` it is given (one streamed chat
completion, temperature 0) and nothing else: no profiler in the nodes. A profiler that intercepts
the process's calls to the engine (kvscope's `session.intercept()`, or `kvscope profile`) names
each call from LangGraph's run context: the agent is the node, the turn is the PEER cycle (the
agent's k-th visit in the invocation), the workflow run is the invocation's root run. What only
the app knows about its prompts (template version, layout, sharing mode, how many leading
messages are the fixed part) rides on the nodes as metadata, `{"kvscope": {...}}`: plain data
that any app can attach, ignored when nothing reads it. The Executor's lookup and calculator are
LangChain tools, so their time is seen as tool runs of the Executor.

A failed model call (an `openai.APIError`, a malformed stream, or a stream without its usage
chunk) ends the workflow it belongs to and no other: the node records it in the state and the
routers send the graph to END.
"""

import operator
from typing import Annotated, Any, TypedDict

import openai
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from kvscope.config import WorkloadConfig
from kvscope.workload import decisions, prompts, sharing
from kvscope.workload.chat import Reply, stream_chat
from kvscope.workload.prompts import PromptInfo
from kvscope.workload.synthetic import SyntheticPrompts
from kvscope.workload.taskset import Problem, TaskSet
from kvscope.workload.tools import calculate, extract_expression, format_hits, lookup

WORKFLOW_TYPE = "peer"
PLANNER, EXECUTOR, EXPRESSER, REVIEWER = prompts.AGENTS
METADATA_KEY = "kvscope"  # the node metadata key a profiler reads the annotations under


class PeerState(TypedDict):
    workflow_index: int  # the workflow's index in its batch (synthetic prompts are seeded by it)
    task_id: str | None  # None in synthetic mode
    cycle: int  # the PEER cycle in progress, from 1
    messages: Annotated[list[dict[str, str]], operator.add]  # transcript: question + replies
    turns: Annotated[list[sharing.Turn], operator.add]  # each call: asked + answered (branch)
    plan: str | None
    execution_result: str | None
    expression: str | None
    review: str | None
    cycles: int  # PEER cycles completed (Reviewer replies received)
    calls: int  # LLM calls made, failed ones included
    unparsed_verdicts: int  # Reviewer replies without a verdict / a choice (dynamic)
    path: Annotated[list[str], operator.add]  # the agents called, in order
    route: str | None  # dynamic: where the Reviewer sent the workflow (an agent or "end")
    verdict: str | None  # the latest parsed verdict
    done: bool  # the Reviewer's routing decision
    failed_agent: str | None
    failed_cycle: int | None
    error_type: str | None


def cycle_bound(cfg: WorkloadConfig) -> int:
    """The most PEER cycles a workflow can run (dynamic: a cycle is at least 3 calls)."""
    if cfg.loop == "dynamic":
        return cfg.max_steps // 3
    return cfg.cycles if cfg.loop == "fixed" else cfg.max_cycles


# Dynamic mode: the Reviewer's choices, and the calls the round each one starts takes.
REVIEW_CHOICES = (PLANNER, EXECUTOR, "end")
ROUND_CALLS = {PLANNER: 4, EXECUTOR: 3}


def dynamic_route(choice: str | None, calls: int, max_steps: int) -> str:
    """Where the Reviewer's choice sends a workflow that has made `calls` calls: the chosen agent,
    or "end" when it chose end, chose nothing, or the round would pass `max_steps` calls."""
    if choice in ROUND_CALLS and calls + ROUND_CALLS[choice] <= max_steps:
        return choice
    return "end"


def loop_done(cfg: WorkloadConfig, cycles: int, verdict: str | None) -> bool:
    """Whether the workflow ends after its `cycles`-th Reviewer reply.

    In model mode an unparseable verdict counts as REVISE, so a model that never says DONE
    runs to max_cycles instead of stopping early or crashing.
    """
    if cfg.loop == "fixed":
        return cycles >= cfg.cycles
    return verdict == "DONE" or cycles >= cfg.max_cycles


def annotations(info: PromptInfo) -> dict[str, Any]:
    """The node metadata that tells a profiler about the prompts (kvscope's annotation keys)."""
    values: dict[str, Any] = {
        "prompt_template_version": info.template_version,
        "layout": info.layout,
        "fixed_messages": info.fixed_messages,
    }
    if info.sharing is not None:
        values["sharing"] = info.sharing
    return {METADATA_KEY: values}


class PeerAgents:
    """The four node functions, bound to one model client, configuration and prompt source."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str,
        cfg: WorkloadConfig,
        *,
        tasks: TaskSet | None = None,
        synthetic: SyntheticPrompts | None = None,
    ) -> None:
        if (tasks is None) == (synthetic is None):
            raise ValueError("PeerAgents needs exactly one of tasks (tasks mode) or synthetic")
        self.client, self.model, self.cfg = client, model, cfg
        self.tasks, self.synthetic = tasks, synthetic
        self.lookup_tool, self.calculator_tool = make_tools(tasks)

    @property
    def prompt_info(self) -> PromptInfo:
        """What the prompts of this configuration are (the same for every call)."""
        if self.synthetic is not None:
            return self.synthetic.prompt_info
        return prompts.prompt_info(self.cfg.layout, self.cfg.sharing)

    async def planner(self, state: PeerState) -> dict[str, Any]:
        cycle = state["cycles"] + 1
        messages = self._messages(PLANNER, state, cycle)
        reply = await self.complete(messages)
        return self._update(PLANNER, cycle, state, reply, "plan", messages)

    async def executor(self, state: PeerState) -> dict[str, Any]:
        cycle = state["cycles"] + 1  # after the Planner or, dynamic, straight after the Reviewer
        tools = self._run_tools(state)
        tool_text = f"{tools[0]}\n{tools[1]}" if tools else None
        messages = self._messages(EXECUTOR, state, cycle, tool_text=tool_text)
        reply = await self.complete(messages)
        update = self._update(EXECUTOR, cycle, state, reply, "execution_result", messages)
        if reply.content is not None and tools:
            # The calculator's value travels with the Executor's words to the Expresser.
            update["execution_result"] = f"{tools[0]} | {update['execution_result']}"
        return update

    async def expresser(self, state: PeerState) -> dict[str, Any]:
        cycle = state["cycle"]
        messages = self._messages(EXPRESSER, state, cycle)
        reply = await self.complete(messages)
        return self._update(EXPRESSER, cycle, state, reply, "expression", messages)

    async def reviewer(self, state: PeerState) -> dict[str, Any]:
        cycle = state["cycle"]
        messages = self._messages(REVIEWER, state, cycle)
        if self.cfg.loop == "dynamic":
            return await self._route(state, cycle, messages)
        reply = await self.complete(messages)
        update = self._update(REVIEWER, cycle, state, reply, "review", messages)
        if reply.content is None:
            return update
        verdict = prompts.parse_verdict(reply.content)
        update.update(
            cycles=cycle,
            verdict=verdict,
            unparsed_verdicts=state["unparsed_verdicts"] + int(verdict is None),
            done=loop_done(self.cfg, cycle, verdict),
        )
        return update

    async def _route(
        self, state: PeerState, cycle: int, messages: list[dict[str, str]]
    ) -> dict[str, Any]:
        """Dynamic mode's Reviewer: one structured-output call that chooses the next agent."""
        messages = decisions.reinstruct(
            messages, prompts.instruction(REVIEWER, cycle=cycle), decisions.REVIEWER_ROUTE
        )
        reply = await self.complete(messages, choices=REVIEW_CHOICES)
        update = self._update(REVIEWER, cycle, state, reply, "review", messages)
        if reply.content is None:
            return update
        choice = decisions.parse_choice(reply.content, REVIEW_CHOICES)
        route = dynamic_route(choice, update["calls"], self.cfg.max_steps)
        update.update(
            review=f"next: {choice}" if choice else reply.content,
            cycles=cycle,
            verdict="DONE" if choice == "end" else "REVISE" if choice else None,
            unparsed_verdicts=state["unparsed_verdicts"] + int(choice is None),
            route=route,
            done=route == "end",
        )
        return update

    async def complete(
        self, messages: list[dict[str, str]], *, choices: tuple[str, ...] | None = None
    ) -> Reply:
        """One streamed chat completion at temperature 0; a failure is a Reply without content.

        Synthetic prompts ask for exactly `synthetic.output_tokens` tokens (vLLM's ignore_eos).
        `choices`: a routing decision, its reply constrained to one of them (decisions.py).
        """
        synthetic = self.synthetic is not None
        extra: dict[str, Any] = {"extra_body": {"ignore_eos": True}} if synthetic else {}
        max_tokens = self.cfg.synthetic.output_tokens if synthetic else self.cfg.max_tokens
        if choices is not None:
            extra = {"response_format": decisions.choice_format(choices)}
            max_tokens = decisions.ROUTE_MAX_TOKENS
        return await stream_chat(self.client, self.model, messages, max_tokens, extra)

    def _messages(
        self, agent: str, state: PeerState, cycle: int, *, tool_text: str | None = None
    ) -> list[dict[str, str]]:
        if self.synthetic is not None:
            return self.synthetic.messages(agent, state["workflow_index"], cycle)
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
            cycle=cycle,
            sharing=self.cfg.sharing,
            layout=self.cfg.layout,
            tool_text=tool_text,
            turns=state["turns"],
        )

    def _run_tools(self, state: PeerState) -> tuple[str, str] | None:
        """The Executor's tool results (calculator, lookup); None when tools are off."""
        if not self.cfg.tool or self.synthetic is not None:
            return None
        problem = self._problem(state)
        hits = self.lookup_tool.invoke(
            {"question": problem.question, "document_ids": list(problem.document_ids)}
        )
        # A 135M model rarely writes a parseable CALC: line; the task's own formula then keeps
        # the tool step real work.
        expression = extract_expression(state["plan"]) or problem.expression
        calc = self.calculator_tool.invoke({"expression": expression})
        return calc, hits

    def _problem(self, state: PeerState) -> Problem:
        assert self.tasks is not None and state["task_id"] is not None
        return self.tasks.problem(state["task_id"])

    @staticmethod
    def _update(
        agent: str,
        cycle: int,
        state: PeerState,
        reply: Reply,
        field: str,
        sent: list[dict[str, str]],
    ) -> dict[str, Any]:
        update: dict[str, Any] = {"cycle": cycle, "calls": state["calls"] + 1, "path": [agent]}
        if reply.content is None:
            update.update(failed_agent=agent, failed_cycle=cycle, error_type=reply.error_type)
            return update
        content = reply.content
        update[field] = content
        update["messages"] = [{"role": "assistant", "name": agent, "content": content}]
        update["turns"] = [sharing.Turn(cycle, sent[-1]["content"], content)]
        return update


def make_tools(tasks: TaskSet | None) -> tuple[BaseTool, BaseTool]:
    """The Executor's LangChain tools: a keyword lookup over the task's documents, a calculator."""

    @tool("lookup")
    def lookup_tool(question: str, document_ids: list[str]) -> str:
        """The document lines that best match the question's keywords."""
        if tasks is None:
            return "lookup: no documents"
        docs = [(d, tasks.document(d).text) for d in document_ids]
        return format_hits(lookup(question, docs))

    @tool("calculator")
    def calculator_tool(expression: str) -> str:
        """The value of an arithmetic expression (+ - * / ** and parentheses over numbers)."""
        return calculate(expression).text

    return lookup_tool, calculator_tool


# Routers are named module-level functions: a lambda router breaks MLflow's span naming
# under ainvoke (see notes/mlflow-langgraph.md).
def route_after_planner(state: PeerState) -> str:
    return END if state["failed_agent"] else EXECUTOR


def route_after_executor(state: PeerState) -> str:
    return END if state["failed_agent"] else EXPRESSER


def route_after_expresser(state: PeerState) -> str:
    return END if state["failed_agent"] else REVIEWER


def route_after_reviewer(state: PeerState) -> str:
    if state["failed_agent"] or state["done"]:
        return END
    return state["route"] or PLANNER  # dynamic: the Reviewer's choice; else another cycle


def build_graph(agents: PeerAgents) -> CompiledStateGraph:
    """The compiled PEER graph; every node carries the prompt annotations as its metadata."""
    meta = annotations(agents.prompt_info)
    graph = StateGraph(PeerState)
    graph.add_node(PLANNER, agents.planner, metadata=meta)
    graph.add_node(EXECUTOR, agents.executor, metadata=meta)
    graph.add_node(EXPRESSER, agents.expresser, metadata=meta)
    graph.add_node(REVIEWER, agents.reviewer, metadata=meta)
    graph.add_edge(START, PLANNER)
    graph.add_conditional_edges(PLANNER, route_after_planner, [EXECUTOR, END])
    graph.add_conditional_edges(EXECUTOR, route_after_executor, [EXPRESSER, END])
    graph.add_conditional_edges(EXPRESSER, route_after_expresser, [REVIEWER, END])
    graph.add_conditional_edges(REVIEWER, route_after_reviewer, [PLANNER, EXECUTOR, END])
    return graph.compile()


def initial_state(workflow_index: int, problem: Problem | None) -> PeerState:
    return PeerState(
        workflow_index=workflow_index,
        task_id=problem.id if problem else None,
        cycle=1,
        messages=[{"role": "user", "content": problem.question}] if problem else [],
        turns=[],
        plan=None,
        execution_result=None,
        expression=None,
        review=None,
        cycles=0,
        calls=0,
        unparsed_verdicts=0,
        path=[],
        route=None,
        verdict=None,
        done=False,
        failed_agent=None,
        failed_cycle=None,
        error_type=None,
    )
