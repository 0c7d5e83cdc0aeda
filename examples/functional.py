"""Researchers in parallel, a writer, a reviewer: a LangGraph Functional API app (`@entrypoint`,
`@task`) written the way LangGraph's documentation writes them, with no kvscope in it.

    kvscope profile -- python examples/functional.py            # the embedded engine
    OPENAI_BASE_URL=http://host:8000/v1 KVSCOPE_MODEL=... python examples/functional.py

    workflow (the entrypoint) --> researcher x3 (one task per angle, launched together)
                              --> writer --> reviewer --> writer again if asked to revise

Each task that calls the model is an agent to kvscope (researcher, writer, reviewer), the
entrypoint the workflow. Each topic is one thread, asked twice: the second invocation gets the
previous answer through the checkpointer (`entrypoint.final`'s `previous`).
"""

import argparse
import functools
import os

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task

ANGLES = ("causes", "examples", "misconceptions")
TOPICS = ("tides", "bread", "rainbows")
MAX_REVISIONS = 1


@functools.cache
def chat() -> ChatOpenAI:
    """The app's model client, made on first use (it reads OPENAI_API_KEY / OPENAI_BASE_URL)."""
    model = os.environ.get("KVSCOPE_MODEL", "default")
    return ChatOpenAI(model=model, max_tokens=32, temperature=0)


def ask(system: str, user: str) -> str:
    return str(chat().invoke([SystemMessage(system), HumanMessage(user)]).content)


@task
def researcher(question: str, angle: str) -> str:
    return ask(f"You are a researcher. In one sentence, give the {angle}.", question)


@task
def writer(question: str, notes: list[str], remark: str = "") -> str:
    brief = "\n".join(notes) + (f"\nReviewer: {remark}" if remark else "")
    return ask("You are a writer. Answer in two sentences from the notes.", f"{question}\n{brief}")


@task
def reviewer(question: str, draft: str) -> str:
    return ask("You review answers. Reply OK, or one thing to fix.", f"{question}\n{draft}")


@entrypoint(checkpointer=InMemorySaver())
def workflow(question: str, *, previous: str | None = None) -> entrypoint.final[str, str]:
    if previous:
        question = f"{question} (Earlier answer: {previous})"
    notes = [f.result() for f in [researcher(question, angle) for angle in ANGLES]]
    draft = writer(question, notes).result()
    for _ in range(MAX_REVISIONS):
        remark = reviewer(question, draft).result()
        if remark.strip().upper().startswith("OK"):
            break
        draft = writer(question, notes, remark).result()
    return entrypoint.final(value=draft, save=draft)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=2, help="threads, one topic each")
    args = parser.parse_args(argv)
    for topic in TOPICS[: args.topics]:
        config = {"configurable": {"thread_id": f"topic-{topic}"}}
        for question in (f"Why do {topic} happen?", "Say it more simply."):
            answer = workflow.invoke(question, config)
            print(f"[{topic}] {question} -> {answer[:60]!r}")


if __name__ == "__main__":
    main()
