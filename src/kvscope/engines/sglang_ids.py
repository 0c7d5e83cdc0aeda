"""SGLang's `return_input_ids_in_sglext`: the prompt's exact token ids, returned with the reply.

What SGLang 0.5.23 does with `"return_input_ids_in_sglext": true` on /v1/chat/completions (read
in its source, sglang/srt/entrypoints/openai/serving_chat.py and protocol.py, and seen live:
tests/fixtures/sglang-0.5.23/prompt_ids/):

- non-streamed: the body gains a top-level `"sglext": {"input_ids": [...]}` (SGLang drops the
  `sglext` key when it has nothing in it, so without the flag the key is absent);
- streamed: one extra chunk after the last choice chunk, with `"choices": []`, `"usage": null`
  and the same `sglext`; the usage chunk follows it unchanged. Where the app asked for other
  `sglext` members, that chunk is sent without the flag too, and the flag only adds `input_ids`
  to it (with the app's header `x-sglext-ids-framed: 1`, the ids come in an event of their own,
  `event: sglext_ids`).
The same flag also comes as the header `x-sglext-return-input-ids: 1`, or for every request
from the server flag `--return-input-ids`; `request_fields` sees neither, so such an app's ids
are taken out too. Other `sglext` members (cached_tokens_details, spec_tokens_details,
output_ids...) come only when asked for.

`without_ids` turns a reply or chunk that carries them back into what SGLang sends without the
flag: the `input_ids` member is cut out of `sglext` with the comma that joins it to its
neighbour (and `sglext` with it when it held nothing else: a byte-level edit, as a
`"input_ids":[` can never occur inside a JSON string), every other byte unchanged; the chunk
only the flag brings is dropped. `sglext` is the last member of SGLang's reply and chunk, and
`input_ids` may sit first, between others (`output_ids`, which SGLang puts after it) or last:
the last `"input_ids"` after the `"sglext"` key is the one cut.
"""

import re
from collections.abc import Mapping
from typing import Any

EDITS_RUNS = False  # without_ids cuts one event's sglext member: an event at a time
FIELD = "return_input_ids_in_sglext"
HEADER = "x-sglext-return-input-ids"
_IDS = rb'"input_ids"\s*:\s*\[[-0-9,\s]*\]'
_ONLY_IDS = re.compile(rb'\s*,\s*"sglext"\s*:\s*\{\s*' + _IDS + rb"\s*\}")
_SGLEXT = re.compile(rb'"sglext"\s*:\s*\{')
_MEMBER = re.compile(_IDS)
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')


def request_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The field to add to a chat `body` to get its prompt's ids; none when the app set it
    itself, or for a completions prompt (SGLang returns its ids on chat only)."""
    if FIELD in body or "messages" not in body:
        return {}
    return {FIELD: True}


def prompt_ids(reply: Mapping[str, Any]) -> list[int] | None:
    """The prompt ids in a reply body or chunk (`sglext.input_ids`); None where there are none
    or they are not a list of ints."""
    ext = reply.get("sglext")
    ids = ext.get("input_ids") if isinstance(ext, Mapping) else None
    if not isinstance(ids, list) or (ids and set(map(type, ids)) != {int}):
        return None
    return ids


def without_ids(data: bytes, chunk: Mapping[str, Any] | None) -> bytes | None:
    """`data` (a reply body, or one SSE event whose parsed JSON is `chunk`) as SGLang sends it
    without the flag; None for the chunk only the flag brings."""
    if chunk is not None and _only_ids_chunk(chunk):
        return None
    if b'"input_ids"' not in data:
        return data
    edited, n = _ONLY_IDS.subn(b"", data, count=1)
    if n:
        return edited
    ext = _SGLEXT.search(data)
    members = list(_MEMBER.finditer(data, ext.end())) if ext else []
    if not members:
        return data
    start, end = members[-1].span()
    before, after = data[:start].rstrip(), data[end:].lstrip()
    if before.endswith(b","):  # after another member: cut from the comma before it
        return before[:-1] + data[end:]
    if after.startswith(b","):  # first of more: cut up to the member after it
        return data[:start] + after[1:].lstrip()
    return data


def may_be_added(event: bytes) -> bool:
    """Whether one SSE event may be the chunk only the flag brings (no choices, the ids): only
    such an event needs its parsed chunk for `without_ids`; for any other `without_ids(event,
    None)` is exact."""
    return b'"input_ids"' in event and _NO_CHOICES.search(event) is not None


def _only_ids_chunk(chunk: Mapping[str, Any]) -> bool:
    """The streamed chunk sent only because of the flag: no choices, no usage, and nothing in
    `sglext` but the ids."""
    ext = chunk.get("sglext")
    return (
        chunk.get("choices") == []
        and chunk.get("usage") is None
        and isinstance(ext, Mapping)
        and set(ext) == {"input_ids"}
    )
