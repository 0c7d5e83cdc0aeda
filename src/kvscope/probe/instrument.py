"""Phase 7 columns of an intercepted call: the prompt's exact token ids and what they say.

`PromptInstrument` is the `CallContext.instrument` of a capture session: from the request body
the app sent, the engine's prompt_tokens and the prompt ids the engine returned (if it did), it
gives the row's prompt columns and appends the ids to the prompt-token stream.

Where the ids come from (`prompt_token_source`):

- "engine": the engine returned them with its reply (vLLM's `return_token_ids`, SGLang's
  `return_input_ids_in_sglext`; probe/wire.py);
- "request": a /v1/completions `prompt` that is itself a list of token ids;
- "tokenizer": the model's chat template and tokenizer (probe/tokens.py): chat `messages`
  (text parts, tool calls and tool messages, the request's `tools`), or a completions `prompt`
  string encoded with the tokenizer's special tokens, as vLLM's completions path does
  (`add_special_tokens` defaults to true there);
- None (and no ids): neither, e.g. an image part, a batch of prompts, a template that raises, no
  tokenizer. The row's other columns are kept: reading a prompt never fails the app's call.

`prompt_token_count` is how many ids kvscope has. When it differs from the engine's own
`prompt_tokens`, `prompt_token_mismatch` is True and the ids are not used: they are not written
to the token stream and the row has no prompt_hash, token_id_hash, fixed_prefix_tokens or
dynamic_suffix_tokens (finalize then treats the row as one without ids). When the engine gave no
count, the mismatch is None and the ids are used.
"""

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kvscope.probe.background import Background
from kvscope.probe.tokenizer_process import TokenizerProcess
from kvscope.probe.tokens import ChatTokenizer, digest, template_messages, token_hash
from kvscope.records.prompt_columns import APP, WORKER, PromptColumns
from kvscope.records.tokens import PromptTokenIds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Prompt:
    ids: tuple[int, ...]
    source: str
    text: str | None  # the serialized prompt (the template's output), where kvscope has it
    fixed: int | None  # tokens up to the end of the fixed messages; None: unknown


class PromptInstrument:
    """The `Instrument` (probe/wire.py) of a capture session; `tokens` None: no tokenizer.

    With a `worker` (probe/background.py) and a `columns_sink`, a call whose ids need the
    tokenizer (the engine returned none) gets its prompt columns off the app's thread: the row
    goes out without them, and a PromptColumns record (records/prompt_columns.py) follows.
    With a `process` too, the worker hands the call to that process (the chat template and the
    tokenizer run there), and makes the columns itself only where the process cannot take it."""

    def __init__(
        self,
        tokens: ChatTokenizer | None,
        token_sink: Callable[[PromptTokenIds], None] | None,
        store_prompts: bool = False,
        *,
        worker: Background | None = None,
        columns_sink: Callable[[PromptColumns], None] | None = None,
        process: TokenizerProcess | None = None,
    ) -> None:
        self.tokens, self.token_sink, self.store_prompts = tokens, token_sink, store_prompts
        self.worker, self.columns_sink, self.process = worker, columns_sink, process

    def __call__(
        self,
        body: Mapping[str, Any],
        request_uuid: str,
        hints: Mapping[str, Any],
        reply: Mapping[str, Any] | None,
        prompt_tokens: int | None,
        engine_ids: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        messages = body.get("messages")
        if self.store_prompts and messages is not None:
            out["raw_messages_json"] = json.dumps(messages, ensure_ascii=False)
        if self.worker is not None and engine_ids is None and self.tokens is not None:
            args = (body, request_uuid, hints, prompt_tokens)
            if self.worker.on_thread():  # the call's end is on the worker already
                self._later(*args, WORKER)
            elif not self.worker.submit(partial(self._later, *args, WORKER)):
                self._later(*args, APP)
            return out
        return out | self.columns(body, request_uuid, hints, prompt_tokens, engine_ids)

    def _later(
        self,
        body: Mapping[str, Any],
        request_uuid: str,
        hints: Mapping[str, Any],
        prompt_tokens: int | None,
        where: str,
    ) -> None:
        if self.process is not None and self.process.send(
            request_uuid, body, _fixed_messages(hints), prompt_tokens
        ):
            return
        columns = self.columns(body, request_uuid, hints, prompt_tokens, None)
        if columns and self.columns_sink is not None:
            self.columns_sink(PromptColumns(request_uuid, **columns, tokenized_on=where))

    def columns(
        self,
        body: Mapping[str, Any],
        request_uuid: str,
        hints: Mapping[str, Any],
        prompt_tokens: int | None,
        engine_ids: Sequence[int] | None,
    ) -> dict[str, Any]:
        """The call's prompt columns (records.prompt_columns.COLUMNS); its ids, where used, go
        to the token sink."""
        messages = body.get("messages")
        fixed_messages = _fixed_messages(hints)
        if isinstance(messages, list):
            pt = self._chat(body, messages, fixed_messages, engine_ids)
        else:
            pt = self._completion(body.get("prompt"), fixed_messages, engine_ids)
        if pt is None:
            return {}
        count = len(pt.ids)
        mismatch = None if prompt_tokens is None else count != prompt_tokens
        out: dict[str, Any] = {
            "prompt_token_source": pt.source,
            "prompt_token_count": count,
            "prompt_token_mismatch": mismatch,
        }
        if mismatch:
            return out  # flagged, never used
        if self.token_sink is not None:
            self.token_sink(PromptTokenIds(request_uuid, pt.ids))
        out |= {
            "prompt_hash": None if pt.text is None else digest(pt.text.encode()),
            "token_id_hash": token_hash(pt.ids),
            "fixed_prefix_tokens": pt.fixed,
            "dynamic_suffix_tokens": None if pt.fixed is None else count - pt.fixed,
        }
        if self.store_prompts and pt.text is not None:
            out["serialized_prompt_text"] = pt.text
        return out

    def _chat(
        self,
        body: Mapping[str, Any],
        messages: list[Any],
        fixed_messages: int | None,
        engine_ids: Sequence[int] | None,
    ) -> _Prompt | None:
        msgs = template_messages(messages)
        if msgs is not None and self.tokens is not None:
            msgs = self.tokens.as_served(msgs, body)
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        text = None
        if msgs is not None and self.tokens is not None:
            try:
                text = self.tokens.render(msgs, tools=tools)
            except Exception:  # TemplateError, a template reading what this body lacks...
                log.debug("kvscope: the chat template could not render a prompt", exc_info=True)
        if engine_ids is not None:
            ids, source = tuple(engine_ids), "engine"
        elif text is not None and self.tokens is not None:
            ids, source = tuple(self.tokens.encode_text(text)), "tokenizer"
        else:
            return None
        fixed: int | None = None
        if fixed_messages is None:
            pass
        elif fixed_messages <= 0:
            fixed = 0
        elif fixed_messages >= len(messages):
            fixed = len(ids)
        elif msgs is not None and self.tokens is not None:
            try:
                fixed = self.tokens.fixed_prefix(ids, msgs, fixed_messages, tools)
            except Exception:
                log.debug("kvscope: the fixed messages could not be rendered", exc_info=True)
        return _Prompt(ids, source, text, fixed)

    def _completion(
        self, prompt: Any, fixed_messages: int | None, engine_ids: Sequence[int] | None
    ) -> _Prompt | None:
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]  # a batch of one prompt is that prompt
        fixed = 0 if fixed_messages == 0 else None  # a raw prompt has no messages
        text = prompt if isinstance(prompt, str) else None
        if engine_ids is not None and (text is not None or _is_ids(prompt)):
            return _Prompt(tuple(engine_ids), "engine", text, fixed)
        if _is_ids(prompt):
            return _Prompt(tuple(prompt), "request", None, fixed)
        if text is not None and self.tokens is not None:
            return _Prompt(
                tuple(self.tokens.encode_text(text, special=True)), "tokenizer", text, fixed
            )
        return None


def _is_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(type(i) is int for i in prompt)


def _fixed_messages(hints: Mapping[str, Any]) -> int | None:
    """The fixed part is what the app says it is: no hint, no fixed_prefix_tokens (null)."""
    hint = hints.get("fixed_messages")
    return None if hint is None else int(hint)
