"""Phase 7 columns of an intercepted call: the prompt's exact token ids and what they say.

`PromptInstrument` is the `CallContext.instrument` of a capture session: from the request body
the app sent (and the engine's reply), it gives the row's prompt columns and appends the ids to
the prompt-token stream.
"""

import json
from collections.abc import Callable, Mapping
from typing import Any

from kvscope.probe.tokens import ChatTokenizer
from kvscope.records.tokens import PromptTokenIds


class PromptInstrument:
    def __init__(
        self,
        tokens: ChatTokenizer | None,
        token_sink: Callable[[PromptTokenIds], None] | None,
        store_prompts: bool = False,
    ) -> None:
        self.tokens, self.token_sink, self.store_prompts = tokens, token_sink, store_prompts

    def __call__(
        self,
        body: Mapping[str, Any],
        request_uuid: str,
        hints: Mapping[str, Any],
        reply: Mapping[str, Any] | None,
        prompt_tokens: int | None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        messages = body.get("messages")
        if self.store_prompts and messages is not None:
            out["raw_messages_json"] = json.dumps(messages, ensure_ascii=False)
        if self.tokens is None or not isinstance(messages, list):
            return out
        pt = self.tokens.prompt(messages, int(hints.get("fixed_messages") or 0))
        if self.token_sink is not None:
            self.token_sink(PromptTokenIds(request_uuid, pt.token_ids))
        out |= {
            "prompt_hash": pt.prompt_hash,
            "token_id_hash": pt.token_id_hash,
            "fixed_prefix_tokens": pt.fixed_prefix_tokens,
            "dynamic_suffix_tokens": len(pt.token_ids) - pt.fixed_prefix_tokens,
            "prompt_token_source": "tokenizer",
            "prompt_token_count": len(pt.token_ids),
            "prompt_token_mismatch": None
            if prompt_tokens is None
            else len(pt.token_ids) != prompt_tokens,
        }
        if self.store_prompts:
            out["serialized_prompt_text"] = pt.text
        return out
