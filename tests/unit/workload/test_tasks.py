import dataclasses
import re
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from kvscope.workload.taskset import TASKS_DIR, TASKS_PACKAGE, Problem, load_tasks
from kvscope.workload.tools import calculate

TOKENIZER = Path.home() / ".cache/kvscope/models/SmolLM2-135M-Instruct/tokenizer.json"
# Scale factors an expression may use that are not figures from a report.
SCALE_CONSTANTS = {"100", "1000", "12"}


def test_task_set_size_and_ids() -> None:
    tasks = load_tasks()
    assert 45 <= len(tasks.problems) <= 60
    assert 8 <= len(tasks.documents) <= 12
    ids = [p.id for p in tasks.problems]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)  # file order is the deterministic order


def test_task_set_is_frozen_and_found_as_package_data() -> None:
    tasks = load_tasks()
    with pytest.raises(dataclasses.FrozenInstanceError):
        tasks.problems[0].answer = 0.0  # type: ignore[misc]
    folder = resources.files(TASKS_PACKAGE).joinpath(TASKS_DIR)
    assert folder.joinpath("documents.json").is_file()
    assert folder.joinpath("problems.json").is_file()


def test_expressions_evaluate_to_the_answers() -> None:
    for problem in load_tasks().problems:
        result = calculate(problem.expression)
        assert result.error is None, problem.id
        assert result.value is not None
        assert round(result.value, 2) == pytest.approx(problem.answer, abs=1e-9), problem.id


def _numbers(text: str) -> set[str]:
    return {n.rstrip(".") for n in re.findall(r"\d[\d,]*\.?\d*", text.replace(",", ""))}


def test_expression_numbers_come_from_the_documents() -> None:
    tasks = load_tasks()
    for problem in tasks.problems:
        in_docs = set().union(*(_numbers(d.text) for d in tasks.documents_for(problem)))
        used = _numbers(problem.expression) - SCALE_CONSTANTS
        assert used <= in_docs, (problem.id, used - in_docs)


def test_problems_share_documents() -> None:
    tasks = load_tasks()
    uses = Counter(d for p in tasks.problems for d in p.document_ids)
    assert set(uses) == {d.id for d in tasks.documents}
    assert min(uses.values()) >= 3
    assert any(len(p.document_ids) == 2 for p in tasks.problems)


def test_lookups_by_id() -> None:
    tasks = load_tasks()
    problem = tasks.problems[-1]
    assert tasks.problem(problem.id) is problem
    assert [d.id for d in tasks.documents_for(problem)] == list(problem.document_ids)
    with pytest.raises(KeyError):
        tasks.document("no-such-document")
    assert isinstance(problem, Problem)


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="SmolLM2 tokenizer not downloaded")
def test_documents_are_short_reports() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    for doc in load_tasks().documents:
        n = len(tok.encode(doc.text, add_special_tokens=False).ids)
        assert 240 <= n <= 450, (doc.id, n)
