"""Routing decisions as structured output: a model call whose reply can only be one of the choices.

A dynamic workflow's routing decision (dynamic PEER's Reviewer, the supervisor) is one ordinary
chat call with OpenAI's `response_format` set to a JSON schema whose whole value is a string enum:

    {"type": "json_schema", "json_schema": {"name": "route", "strict": true,
     "schema": {"type": "string", "enum": ["planner", "executor", "end"]}}}

vLLM (xgrammar / guidance) and SGLang both take this form; the engine's grammar lets the model
write only `"planner"`, `"executor"` or `"end"`, so the reply parses every time, and which one
it writes still depends on the prompt. A bare string (not an object) leaves the grammar no room
for whitespace: on vLLM CPU 0.32.0 an object schema `{"next": ...}` wasted 16 tokens on newlines
and never closed, a string enum took 4 tokens. ROUTE_MAX_TOKENS bounds the reply well above the
longest choice. `parse_choice` still checks the reply: a reply it cannot read (an engine that
ignored `response_format`) is counted as unparsed by the caller, never guessed.
"""

import json
from collections.abc import Sequence
from typing import Any

ROUTE_MAX_TOKENS = 16  # the longest choice is ~5 tokens with its quotes
SCHEMA_NAME = "route"


def choice_format(choices: Sequence[str]) -> dict[str, Any]:
    """The `response_format` that constrains a reply to one of `choices` (a JSON string)."""
    if not choices:
        raise ValueError("a routing decision needs at least one choice")
    return {
        "type": "json_schema",
        "json_schema": {
            "name": SCHEMA_NAME,
            "strict": True,
            "schema": {"type": "string", "enum": list(choices)},
        },
    }


def parse_choice(text: str | None, choices: Sequence[str]) -> str | None:
    """The choice a constrained reply names (`"executor"` -> executor), or None if it names none.

    A bare word (an engine that returned the choice without JSON quotes) is accepted too.
    """
    if text is None:
        return None
    raw = text.strip()
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return value if isinstance(value, str) and value in choices else None


# Dynamic PEER's Reviewer: what it is asked instead of a VERDICT line (the rest of its prompt,
# documents and workflow state included, is unchanged, so its prefix reuse is PEER's own).
# Wording measured on SmolLM2-135M over 8 shipped tasks' first reviews: this one chose end 4
# times and executor 4 times; listing planner first made it choose only planner or executor.
REVIEWER_ROUTE = (
    "Decide the next step. If the answer draft states the calculator value with its unit, choose "
    "end. If the answer draft's value differs from the calculator value, choose executor. If the "
    "plan computes the wrong quantity, choose planner. Reply with one word: end, executor or "
    "planner."
)


def reinstruct(
    messages: list[dict[str, str]], instruction: str, replacement: str
) -> list[dict[str, str]]:
    """`messages` with the last message's trailing `instruction` replaced by `replacement`."""
    last = messages[-1]["content"]
    if not last.endswith(instruction):
        raise ValueError("the last message does not end with the expected instruction")
    head = last[: len(last) - len(instruction)]
    return [*messages[:-1], {**messages[-1], "content": head + replacement}]
