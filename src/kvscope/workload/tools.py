"""Deterministic local tools for the Executor: a safe calculator and a document lookup.

Both return results, never raise on bad input: a tool error is something the agent sees.
"""

import ast
import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64.0

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
# "1,284.6" in a model's expression means 1284.6, not a tuple.
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


@dataclass(frozen=True)
class CalcResult:
    expression: str
    value: float | None
    error: str | None

    @property
    def text(self) -> str:
        if self.error is not None:
            return f"calculator error: {self.error}"
        assert self.value is not None
        # The expression is in the plan already; echoing it would cost prompt tokens twice.
        return f"calculator: {format_number(self.value)}"


def format_number(value: float) -> str:
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def calculate(expression: str) -> CalcResult:
    """Evaluate + - * / ** and parentheses over plain numbers; anything else is an error result."""
    expr = _THOUSANDS.sub("", expression.strip())
    if not expr:
        return CalcResult(expression, None, "no expression")
    if len(expr) > MAX_EXPRESSION_CHARS:
        return CalcResult(expression, None, f"expression longer than {MAX_EXPRESSION_CHARS} chars")
    try:
        tree = ast.parse(expr, mode="eval")
        value = _eval(tree.body)
    except SyntaxError:
        return CalcResult(expr, None, "not an arithmetic expression")
    except ZeroDivisionError:
        return CalcResult(expr, None, "division by zero")
    except (OverflowError, ValueError) as err:
        return CalcResult(expr, None, str(err) or type(err).__name__)
    if not math.isfinite(value):
        return CalcResult(expr, None, "result is not finite")
    return CalcResult(expr, value, None)


def _eval(node: ast.expr) -> float:
    if isinstance(node, ast.Constant):
        # bool is an int subclass: True + 1 must not be "arithmetic over numbers".
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"unsupported constant {node.value!r}")
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent larger than {MAX_EXPONENT:g}")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, complex):
            raise ValueError("complex result")
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


# Pulls an arithmetic expression out of free text (a Planner's "CALC: ..." line).
_CALC_LINE = re.compile(r"CALC:[ \t]*([-+*/().,\d \t]+)", re.IGNORECASE)


def extract_expression(text: str | None) -> str:
    """The expression after the last `CALC:` marker, or "" when there is none."""
    if not text:
        return ""
    found = _CALC_LINE.findall(text)
    return found[-1].strip() if found else ""


# re.findall rather than str.split so the list stays a compact string (ruff SIM905).
_STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a an and are as at be by did do does for from how in is it its of on or the to was were "
        "what which with this that than during year years compared between",
    )
)
_WORD = re.compile(r"[a-z0-9][a-z0-9&-]*")
_YEAR = re.compile(r"(19|20)\d\d")


def keywords(question: str) -> tuple[str, ...]:
    """Lowercase content words of a question (and short codes like "q4"), in order, once each."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(question.lower()):
        short_code = len(word) == 2 and any(c.isdigit() for c in word)
        if (len(word) >= 3 or short_code) and word not in _STOPWORDS:
            seen.setdefault(word, None)
    return tuple(seen)


@dataclass(frozen=True)
class LookupHit:
    document_id: str
    line: str
    score: float


def lookup(
    question: str, documents: Iterable[tuple[str, str]], *, max_lines: int = 2
) -> tuple[LookupHit, ...]:
    """The document lines that best match the question's keywords.

    `documents` are (document_id, text) pairs. A keyword counts 1/(lines it occurs in), so a
    word found on one line ("margin") outweighs one found everywhere; a year counts half, since
    dates head every report. A document's first line is its title and names the company, which
    every question about it mentions, so it is not a candidate. Ties keep document order, so
    the result is stable.
    """
    keys = keywords(question)
    lines: list[tuple[str, str, set[str]]] = []
    for doc_id, text in documents:
        for line in text.splitlines()[1:]:
            line = line.strip()
            if line:
                stems = {_stem(w) for w in _WORD.findall(line.lower())}
                words = {k for k in keys if _stem(k) in stems}
                lines.append((doc_id, line, words))
    frequency = {k: sum(1 for *_, words in lines if k in words) for k in keys}
    scored = [
        (sum(_weight(k) / frequency[k] for k in words), position, LookupHit(doc_id, line, 0.0))
        for position, (doc_id, line, words) in enumerate(lines)
        if words
    ]
    best = sorted(scored, key=lambda item: (-item[0], item[1]))[:max_lines]
    return tuple(
        LookupHit(hit.document_id, hit.line, round(score, 4))
        for score, _, hit in sorted(best, key=lambda item: item[1])
    )


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def _weight(keyword: str) -> float:
    return 0.5 if _YEAR.fullmatch(keyword) else 1.0


def format_hits(hits: tuple[LookupHit, ...], *, max_chars: int = 240) -> str:
    if not hits:
        return "lookup: no matching lines"
    text = "\n".join(f"[{h.document_id}] {h.line}" for h in hits)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
