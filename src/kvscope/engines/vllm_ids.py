"""vLLM's `return_token_ids`: the prompt's exact token ids, returned with the reply.

What vLLM 0.32.0 does with `"return_token_ids": true` (read in its source:
vllm/entrypoints/openai/chat_completion/{protocol,serving}.py and
vllm/entrypoints/openai/completion/{protocol,serving}.py):

- /v1/chat/completions, non-streamed: top-level `prompt_token_ids` and each choice's `token_ids`
  (the generated ids) are lists instead of null (the body is `model_dump()`ed: both keys are
  always there).
- /v1/chat/completions, streamed: the first chunk of each choice (the `role` delta) carries the
  top-level `prompt_token_ids` (null without the flag); every later chunk's choice carries its
  delta's `token_ids` (null without). Where a tool or reasoning parser holds a token back, a chunk
  with an empty delta (no finish_reason, no logprobs) is sent that is skipped without the flag.
- /v1/completions: the ids are per choice: `choices[i].prompt_token_ids` (non-streamed: every
  choice; streamed: the first chunk of each choice) and `choices[i].token_ids`; null without.
- with `echo`, the flag empties the echoed prompt text: kvscope never adds it to such a call.

`without_ids` turns a reply or chunk that carries them back into the bytes vLLM sends without
the flag: each id list becomes `null` in place (a byte-level edit: a `"token_ids":[` can never
occur inside a JSON string, whose quotes are escaped), every other byte unchanged.
"""

import re
from collections.abc import Mapping
from typing import Any

FIELD = "return_token_ids"
# without_ids nulls every id list in what it is given: a run of whole events is edited as each alone
EDITS_RUNS = True
# `token_ids"` first (a literal the scan looks for), then a look back that it was the whole key
_IDS = re.compile(rb'(token_ids"(?:(?<="token_ids")|(?<="prompt_token_ids"))\s*:\s*)\[[-0-9,\s]*\]')
_EMPTY_DELTA = re.compile(rb'"delta"\s*:\s*\{\s*\}')
_COMPACT = (b'"token_ids":[', b'"prompt_token_ids":[')  # as vLLM writes them (no spaces)
_SPACED = re.compile(rb'token_ids"\s*:\s*\[')  # a list left: written with spaces


def request_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields to add to `body` to get its prompt's ids: none when the app set the flag
    itself (its choice stands) or asked for `echo` (the flag would change the echoed text)."""
    if FIELD in body or body.get("echo"):
        return {}
    return {FIELD: True}


def prompt_ids(reply: Mapping[str, Any]) -> list[int] | None:
    """The prompt ids in a reply body or chunk: top-level (chat) or the first choice that has
    them (completions); None where none are there or they are not a list of ints."""
    ids = reply.get("prompt_token_ids")
    if ids is None:
        choices = reply.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, Mapping) and choice.get("prompt_token_ids") is not None:
                ids = choice["prompt_token_ids"]
                break
    if not isinstance(ids, list) or (ids and set(map(type, ids)) != {int}):
        return None
    return ids


def without_ids(data: bytes, chunk: Mapping[str, Any] | None) -> bytes | None:
    """`data` (a reply body, or one SSE event whose parsed JSON is `chunk`) as vLLM sends it
    without the flag: id lists -> null; None for a chunk that only the flag brings."""
    if chunk is not None and _held_back(chunk):
        return None
    if b"_ids" not in data:
        return data
    spans = []  # vLLM's compact lists, found by `find` (a fast scan), cut out in one join
    for key in _COMPACT:
        start = data.find(key)
        while start != -1:
            end = data.find(b"]", start)
            if end == -1:
                break
            spans.append((start + len(key) - 1, end + 1))
            start = data.find(key, end)
    if spans:
        parts, at = [], 0
        for start, end in sorted(spans):
            parts += [data[at:start], b"null"]
            at = end
        data = b"".join([*parts, data[at:]])
    return _IDS.sub(rb"\1null", data) if _SPACED.search(data) else data


def may_be_added(event: bytes) -> bool:
    """Whether one SSE event may be a chunk only the flag brings (an empty delta): only such an
    event needs its parsed chunk for `without_ids`; for any other `without_ids(event, None)` is
    exact."""
    return (b"{}" in event or b"{ " in event) and _EMPTY_DELTA.search(event) is not None


def _held_back(chunk: Mapping[str, Any]) -> bool:
    """A streamed chat chunk sent only because of the flag (a parser held its token back)."""
    choices = chunk.get("choices")
    if chunk.get("object") != "chat.completion.chunk" or not isinstance(choices, list):
        return False
    return bool(choices) and all(
        isinstance(c, Mapping)
        and c.get("delta") == {}
        and c.get("finish_reason") is None
        and c.get("logprobs") is None
        and c.get("token_ids") is not None
        for c in choices
    )
