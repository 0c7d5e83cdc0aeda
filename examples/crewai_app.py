"""A newsletter desk: a researcher finds a fact, a writer turns it into a line, an editor tidies
it: a CrewAI app (`pip install crewai`) written the way CrewAI's documentation writes crews,
with no kvscope in it.

    kvscope profile -- /path/to/venv/bin/python examples/crewai_app.py
    kvscope profile -- /path/to/venv/bin/python examples/crewai_app.py --hierarchical
    OPENAI_BASE_URL=http://host:8000/v1 KVSCOPE_MODEL=... python examples/crewai_app.py

    Crew.kickoff (one per topic) --> researcher --> writer --> editor       (Process.sequential)
    Crew.kickoff --> manager --delegates--> researcher / writer / editor  (--hierarchical)

Each agent is an agent to kvscope (its role: researcher, writer, editor; the manager with
`--hierarchical`), each kickoff a workflow, each task the agent's turn. The model server is the
OpenAI SDK's (OPENAI_BASE_URL, OPENAI_API_KEY), the model KVSCOPE_MODEL's. The prompts are short
and the answers few tokens, for a model as small as SmolLM2-135M on a CPU engine: no agent has a
tool of its own and each takes one iteration (`max_iter=1`), its answer whatever the model says
(no output model to parse). With `--hierarchical` the tasks have no agent: a manager agent
(`manager_agent`, two iterations) delegates each with CrewAI's delegation tools, which a model
that small calls or not as it likes (the engine must accept `tool_choice: auto`: kvscope's vLLM
engine enables it). CrewAI's anonymous telemetry and trace upload are off (nothing leaves for
CrewAI's servers).
"""

import argparse
import os

TOPICS = ("tea", "bicycles", "owls")


def build(hierarchical: bool) -> object:
    """The crew: three role agents with one task each, run in order, or by a manager."""
    from crewai import LLM, Agent, Crew, Process, Task

    llm = LLM(model=os.environ.get("KVSCOPE_MODEL", "SmolLM2-135M-Instruct"), provider="openai",
              max_tokens=32, temperature=0.0)  # fmt: skip

    def agent(role: str, goal: str) -> Agent:
        return Agent(role=role, goal=goal, backstory=f"You are a {role}.", llm=llm, max_iter=1,
                     allow_delegation=False)  # fmt: skip

    researcher = agent("researcher", "Find one fact.")
    writer = agent("writer", "Write one line.")
    editor = agent("editor", "Tidy one line.")
    tasks = [
        Task(name="research", description="Give one fact about {topic}.",
             expected_output="One fact.", agent=None if hierarchical else researcher),
        Task(name="write", description="Write one line about {topic} from the fact.",
             expected_output="One line.", agent=None if hierarchical else writer),
        Task(name="edit", description="Tidy the line about {topic}.",
             expected_output="The tidy line.", agent=None if hierarchical else editor),
    ]  # fmt: skip
    if not hierarchical:
        return Crew(agents=[researcher, writer, editor], tasks=tasks, process=Process.sequential)
    manager = Agent(role="manager", goal="Get each task done by the right coworker.",
                    backstory="You run the desk.", llm=llm, max_iter=2,
                    allow_delegation=True)  # fmt: skip
    return Crew(agents=[researcher, writer, editor], tasks=tasks, process=Process.hierarchical,
                manager_agent=manager)  # fmt: skip


def main(topics: int, hierarchical: bool) -> None:
    crew = build(hierarchical)
    for topic in TOPICS[:topics]:
        result = crew.kickoff(inputs={"topic": topic})  # type: ignore[attr-defined]
        print(f"[{topic}] {str(result).strip()[:200]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=2, help="kickoffs, one per topic (1-3)")
    parser.add_argument(
        "--hierarchical", action="store_true", help="Process.hierarchical: a manager delegates"
    )
    args = parser.parse_args()
    os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # before crewai is imported
    os.environ.setdefault("OTEL_SDK_DISABLED", "true")
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
    main(max(1, min(args.topics, len(TOPICS))), args.hierarchical)
