"""The supervisor workload's prompts (kvscope.workload.supervisor): one layout, shared-first.

Every call's system message starts with the same team preamble and the task's documents, then
the agent's role; the user message carries the question, the work done so far and the request.
So all agents of a workflow share the preamble + documents prefix, and the fan-out's parallel
researcher branches share it at the same moment.
"""

from collections.abc import Mapping, Sequence

from kvscope.workload import prompts
from kvscope.workload.taskset import Document

TEMPLATE_VERSION = "supervisor-fqa-v1"
SUPERVISOR = "supervisor"
FINISH = "finish"
# The workers, in the order `workload.workers` takes them (3..6).
WORKERS: tuple[str, ...] = ("researcher", "analyst", "writer", "critic", "auditor", "editor")
# The researcher fans out: one parallel branch per (document, focus).
FOCUSES: tuple[str, ...] = (
    "the figures the question needs",
    "the units and periods of those figures",
)
OUTPUT_LIMIT = 160  # characters of each worker's latest output the others see

PREAMBLE = (
    "You are one agent of a financial analysis team led by a supervisor who assigns the work "
    "to its workers. The team answers questions about company reports. Use only the numbers in "
    "the documents below, in the units the documents state."
)

ROLES: dict[str, str] = {
    SUPERVISOR: (
        "Role: Supervisor. Look at what the workers have done and choose who works next. "
        "Research comes before analysis, analysis before writing; checks come after a draft. "
        "Choose finish once the answer is written and nothing is left to fix."
    ),
    "researcher": "Role: Researcher. Quote the lines of the documents that matter, briefly.",
    "analyst": (
        "Role: Analyst. Compute the answer from the research notes and the calculator value: "
        "the figures used and the result."
    ),
    "writer": "Role: Writer. Write the final answer in one sentence, with its unit.",
    "critic": "Role: Critic. Name the one biggest problem of the draft answer, or say none.",
    "auditor": "Role: Auditor. Check that the draft's figures, units and periods match.",
    "editor": "Role: Editor. Rewrite the draft answer clearly and briefly, with its unit.",
}

REQUESTS: dict[str, str] = {
    "analyst": "Write the computation.",
    "writer": "Write the answer.",
    "critic": "Review the draft answer.",
    "auditor": "Audit the draft answer.",
    "editor": "Rewrite the draft answer.",
}


def system(agent: str, documents: Sequence[Document]) -> str:
    return "\n\n".join([PREAMBLE, prompts.documents_text(documents), ROLES[agent]])


def work_done(work: Mapping[str, str], workers: Sequence[str]) -> str:
    """The workers' latest outputs (cut), and who has not worked yet."""
    lines = ["Work so far:"]
    for worker in workers:
        output = work.get(worker)
        shown = prompts.truncate(output, OUTPUT_LIMIT) if output else "(not done yet)"
        lines.append(f"- {worker}: {shown}")
    return "\n".join(lines)


def supervisor_messages(
    documents: Sequence[Document],
    question: str,
    work: Mapping[str, str],
    workers: Sequence[str],
    choices: Sequence[str],
) -> list[dict[str, str]]:
    ask = (
        f"Question: {question}\n{work_done(work, workers)}\n"
        f"Who works next? Reply with one word: {', '.join(choices)}."
    )
    return [
        {"role": "system", "content": system(SUPERVISOR, documents)},
        {"role": "user", "content": ask},
    ]


def researcher_messages(
    documents: Sequence[Document], question: str, document: Document, focus: str
) -> list[dict[str, str]]:
    ask = f"Question: {question}\nFrom [{document.id}] only, quote {focus}."
    return [
        {"role": "system", "content": system("researcher", documents)},
        {"role": "user", "content": ask},
    ]


def worker_messages(
    worker: str,
    documents: Sequence[Document],
    question: str,
    work: Mapping[str, str],
    workers: Sequence[str],
    tool_text: str | None = None,
) -> list[dict[str, str]]:
    tools = f"\nCalculator: {tool_text}" if tool_text else ""
    ask = f"Question: {question}\n{work_done(work, workers)}{tools}\n{REQUESTS[worker]}"
    return [
        {"role": "system", "content": system(worker, documents)},
        {"role": "user", "content": ask},
    ]
