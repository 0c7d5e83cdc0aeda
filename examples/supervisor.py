"""A supervisor routing among workers, with a subgraph agent and a parallel review: a LangGraph
app written the way LangGraph's documentation writes them, with no kvscope in it.

    kvscope profile -- python examples/supervisor.py            # the embedded engine
    OPENAI_BASE_URL=http://host:8000/v1 KVSCOPE_MODEL=... python examples/supervisor.py

    supervisor --> researcher (a subgraph: gather -> draft, the lookup a LangChain tool)
        ^      --> writer
        |      --> review (Send: one critic branch per angle, in parallel) --> supervisor
        +------------------------------------------------------------------+

The supervisor asks the model who goes next; a small model's answer is often not a worker's
name, so the app falls back to the next worker in order (its own rule, not kvscope's). Each
topic is one thread, asked twice (two invocations, the second one continuing the conversation
through the checkpointer).
"""

import argparse
import functools
import operator
import os
from typing import Annotated, Literal, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Send

WORKERS = ("researcher", "writer", "review")
ANGLES = ("accuracy", "clarity")
NOTES = {
    "tides": "Tides come from the Moon's gravity pulling the oceans; the Sun adds a smaller pull.",
    "bread": "Yeast eats sugar and makes carbon dioxide, which makes dough rise.",
    "rainbows": "Sunlight refracts and reflects inside raindrops, splitting into colours.",
}


@functools.cache
def chat(streaming: bool = False) -> ChatOpenAI:
    """The app's model client, made on first use (it reads OPENAI_API_KEY / OPENAI_BASE_URL)."""
    return ChatOpenAI(
        model=os.environ.get("KVSCOPE_MODEL", "default"), max_tokens=32, temperature=0,
        streaming=streaming, stream_usage=streaming,
    )  # fmt: skip


class State(MessagesState):
    rounds: int
    reviews: Annotated[list[str], operator.add]


@tool
def lookup(topic: str) -> str:
    """Find the notes about a topic."""
    return next((text for key, text in NOTES.items() if key in topic.lower()), "no notes")


# --- the researcher: a subgraph agent ------------------------------------------------------
class Research(TypedDict):
    messages: Annotated[list[AnyMessage], operator.add]
    notes: str


def gather(state: Research) -> dict:
    question = state["messages"][0].content
    return {"notes": lookup.invoke({"topic": str(question)})}


def draft(state: Research) -> dict:
    reply = chat().invoke(
        [
            SystemMessage("You are a researcher. Summarise the notes in one sentence."),
            HumanMessage(f"Notes: {state['notes']}\nQuestion: {state['messages'][0].content}"),
        ]
    )
    return {"messages": [AIMessage(reply.content, name="researcher")]}


research = StateGraph(Research)
research.add_node("gather", gather)
research.add_node("draft", draft)
research.add_edge(START, "gather")
research.add_edge("gather", "draft")
research.add_edge("draft", END)
researcher = research.compile()


# --- the other workers ---------------------------------------------------------------------
def writer(state: State) -> dict:
    system = SystemMessage("You are a writer. Answer the user's question in two sentences.")
    stream = chat(streaming=True).stream([system, *state["messages"]])
    text = "".join(str(chunk.content) for chunk in stream)
    return {"messages": [AIMessage(text, name="writer")]}


def review(state: State) -> Command[Literal["critic"]]:
    return Command(
        goto=[Send("critic", {"angle": a, "messages": state["messages"]}) for a in ANGLES]
    )


def critic(task: dict) -> dict:
    reply = chat().invoke(
        [SystemMessage(f"You review answers for {task['angle']}. One short remark."),
         *task["messages"][-2:]]
    )  # fmt: skip
    return {"reviews": [f"{task['angle']}: {reply.content}"]}


def supervisor(state: State) -> Command[Literal["researcher", "writer", "review", "__end__"]]:
    if state.get("rounds", 0) >= len(WORKERS):
        return Command(goto=END, update={"rounds": 0})
    reply = chat().invoke(
        [
            SystemMessage(
                "You are a supervisor managing: researcher, writer, review. "
                "Reply with the one worker who should act next."
            ),
            *state["messages"],
        ]
    )
    said = str(reply.content).lower()
    fallback = WORKERS[state.get("rounds", 0) % len(WORKERS)]
    goto = next((w for w in WORKERS if w in said), fallback)
    return Command(goto=goto, update={"rounds": state.get("rounds", 0) + 1})


builder = StateGraph(State)
builder.add_node("supervisor", supervisor)
builder.add_node("researcher", researcher)
builder.add_node("writer", writer)
builder.add_node("review", review)
builder.add_node("critic", critic)
builder.add_edge(START, "supervisor")
builder.add_edge("researcher", "supervisor")
builder.add_edge("writer", "supervisor")
builder.add_edge("critic", "supervisor")
graph = builder.compile(checkpointer=InMemorySaver())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=2, help="threads, one topic each")
    args = parser.parse_args()
    for topic in list(NOTES)[: args.topics]:
        config = {"configurable": {"thread_id": f"topic-{topic}"}, "recursion_limit": 30}
        for question in (f"Why do {topic} happen?", "Say it more simply."):
            out = graph.invoke({"messages": [HumanMessage(question)], "rounds": 0}, config)
            print(f"[{topic}] {question} -> {str(out['messages'][-1].content)[:60]!r}")


if __name__ == "__main__":
    main()
