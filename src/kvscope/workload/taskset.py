"""The financial-QA task set (package data under kvscope/workload/tasks/).

Ten short fictional company reports and ~50 questions over them; several questions share a
document so that concurrent workflows share prompt context, as in PEER's financial QA.
Each question carries the arithmetic expression that answers it and the rounded answer.
"""

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

TASKS_PACKAGE = "kvscope.workload"
TASKS_DIR = "tasks"


@dataclass(frozen=True)
class Document:
    id: str
    company: str
    period: str
    kind: str  # e.g. "annual report excerpt"
    text: str


@dataclass(frozen=True)
class Problem:
    id: str
    document_ids: tuple[str, ...]
    question: str
    expression: str  # ground truth over numbers that appear in the documents
    answer: float  # the expression's value, rounded to 2 decimals
    unit: str  # "%", "pp", "x", "USD million", ...


@dataclass(frozen=True)
class TaskSet:
    documents: tuple[Document, ...]
    problems: tuple[Problem, ...]

    def document(self, document_id: str) -> Document:
        for doc in self.documents:
            if doc.id == document_id:
                return doc
        raise KeyError(document_id)

    def documents_for(self, problem: Problem) -> tuple[Document, ...]:
        return tuple(self.document(d) for d in problem.document_ids)

    def problem(self, problem_id: str) -> Problem:
        for p in self.problems:
            if p.id == problem_id:
                return p
        raise KeyError(problem_id)


@cache
def load_tasks() -> TaskSet:
    """The packaged task set, in file order (deterministic)."""
    folder = resources.files(TASKS_PACKAGE).joinpath(TASKS_DIR)
    docs_raw = _read(folder.joinpath("documents.json").read_text(encoding="utf-8"), "documents")
    probs_raw = _read(folder.joinpath("problems.json").read_text(encoding="utf-8"), "problems")
    documents = tuple(
        Document(
            id=d["id"], company=d["company"], period=d["period"], kind=d["kind"], text=d["text"]
        )
        for d in docs_raw
    )
    known = {d.id for d in documents}
    problems = tuple(
        Problem(
            id=p["id"],
            document_ids=tuple(p["document_ids"]),
            question=p["question"],
            expression=p["expression"],
            answer=float(p["answer"]),
            unit=p["unit"],
        )
        for p in probs_raw
    )
    for p in problems:
        missing = [d for d in p.document_ids if d not in known]
        if missing or not p.document_ids:
            raise ValueError(f"task {p.id}: unknown or no documents {missing}")
    ids = [p.id for p in problems] + [d.id for d in documents]
    if len(set(ids)) != len(ids):
        raise ValueError("task set: duplicate ids")
    return TaskSet(documents=documents, problems=problems)


def _read(text: str, key: str) -> list[dict[str, Any]]:
    data = json.loads(text)
    if data.get("version") != 1 or not isinstance(data.get(key), list):
        raise ValueError(f"task set: expected version 1 with a `{key}` list")
    return data[key]
