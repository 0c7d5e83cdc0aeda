"""The exact token sequence a prompt becomes: the model's own chat template and tokenizer.

Cache reuse depends on the final tokens, not on the text a human sees (design note, Phase 7), so
kvscope renders the model's chat template (Jinja, as Hugging Face's apply_chat_template does)
and encodes the result with the model's tokenizer. The embedded engine reports its own prompt
token count on every call; a row whose count differs is flagged, never silently used.

An app's chat messages reach the template the way vLLM's chat path (vllm/renderers/chat_utils.py)
hands them to a template that takes string content (`template_messages`): a list of text parts
joined with "\n", `content: null` as "", an assistant's `tool_calls` with their `arguments` as
JSON objects (a string that is not one: {}), a tool message's `tool_call_id` and a `name` kept,
other keys dropped. The request's `tools` reach the template as its `tools` variable (None when
absent), as HF's apply_chat_template passes them; vLLM passes them with its schema's defaults
filled in, so a template that prints whole tool objects can render differently there (the count
check flags that row). An engine that serves a conversation ending with an assistant message as
the user's (SGLang: Engine.chat_trailing_assistant_as_user) is followed (`as_served`).
"""

import hashlib
import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from kvscope.records.tokens import common_prefix

Messages = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class PromptTokens:
    token_ids: tuple[int, ...]
    text: str  # the serialized prompt: the chat template's output
    fixed_prefix_tokens: int  # tokens up to the end of the fixed (leading) messages

    @property
    def prompt_hash(self) -> str:
        return digest(self.text.encode())

    @property
    def token_id_hash(self) -> str:
        return token_hash(self.token_ids)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def token_hash(ids: Sequence[int]) -> str:
    return digest(array("q", ids).tobytes())


class ChatTokenizer:
    def __init__(self, tokenizer: Tokenizer, template: str, special: dict[str, Any]) -> None:
        # As transformers' render_jinja_template sets it up (the engines render with it): an
        # undefined name is empty (templates test `message.tool_calls` on messages without
        # any), but using one further (`x.missing.attr`) raises UndefinedError.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        self.tokenizer = tokenizer
        self.template = env.from_string(template)
        self.special = special
        self.model_dir: Path | None = None  # the folder it was read from (from_model_dir)
        self.trailing_assistant_as_user = False  # the engine's (as_served)

    @classmethod
    def from_model_dir(
        cls, path: Path, *, trailing_assistant_as_user: bool = False
    ) -> "ChatTokenizer | None":
        """The tokenizer and chat template of a Hugging Face model folder; None if incomplete.
        `trailing_assistant_as_user`: the engine's (Engine.chat_trailing_assistant_as_user)."""
        tok, cfg = path / "tokenizer.json", path / "tokenizer_config.json"
        if not tok.is_file():
            return None
        config = json.loads(cfg.read_text()) if cfg.is_file() else {}
        template = config.get("chat_template")
        if not template and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        if not isinstance(template, str):
            return None
        special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token")}
        chat = cls(Tokenizer.from_file(str(tok)), template, special)
        chat.model_dir = path
        chat.trailing_assistant_as_user = trailing_assistant_as_user
        return chat

    def as_served(
        self, messages: list[dict[str, Any]], body: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """The (template_messages-normalized) messages as the engine renders them: where it
        serves a trailing assistant message with text content as the user's
        (`trailing_assistant_as_user`) and the call does not ask to continue_final_message,
        that message's role is "user" (a copy; `messages` are not changed)."""
        last = messages[-1] if messages else None
        if (
            not self.trailing_assistant_as_user
            or last is None
            or last["role"] != "assistant"
            or body.get("continue_final_message")
        ):
            return messages
        return [*messages[:-1], {"role": "user", "content": last["content"]}]

    def render(
        self,
        messages: Messages,
        *,
        generation_prompt: bool = True,
        tools: Sequence[Any] | None = None,
    ) -> str:
        """The template's text for these (template_messages-normalized) messages; raises
        jinja2's TemplateError (UndefinedError included) for what the template rejects."""
        return self.template.render(
            messages=list(messages),
            tools=None if tools is None else list(tools),
            add_generation_prompt=generation_prompt,
            **self.special,
        )

    def encode_text(self, text: str, *, special: bool = False) -> list[int]:
        """Ids of `text`; `special`: add the tokenizer's special tokens (BOS...) as a raw
        completions prompt gets them. A rendered chat template already wrote its own (as HF's
        apply_chat_template assumes), so it is encoded without. Encoded as a batch of one:
        `encode_batch` lets go of the GIL while it works (`encode` holds it), so the app's
        threads run meanwhile (probe/background.py's thread encodes where no tokenizer process
        does)."""
        return self.tokenizer.encode_batch([text], add_special_tokens=special)[0].ids

    def prompt(
        self,
        messages: Messages,
        fixed_messages: int = 0,
        tools: Sequence[Any] | None = None,
    ) -> PromptTokens:
        """The prompt's ids, its text, and where its first `fixed_messages` messages end."""
        text = self.render(messages, tools=tools)
        ids = tuple(self.encode_text(text))
        return PromptTokens(ids, text, self.fixed_prefix(ids, messages, fixed_messages, tools))

    def fixed_prefix(
        self,
        ids: Sequence[int],
        messages: Messages,
        fixed_messages: int,
        tools: Sequence[Any] | None = None,
    ) -> int:
        """How many of `ids` (the whole prompt's, from this tokenizer or the engine) the first
        `fixed_messages` messages cover: the common prefix with their own rendering."""
        if fixed_messages <= 0:
            return 0
        if fixed_messages >= len(messages):
            return len(ids)
        head = self.render(messages[:fixed_messages], generation_prompt=False, tools=tools)
        return common_prefix(ids, self.encode_text(head))


def template_messages(messages: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The app's chat messages as vLLM hands them to a string-content template (module
    docstring); None when one cannot be rendered as text (an image or audio part, a part or
    message of unknown shape). The app's own objects are not changed."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            return None
        content = _text(message.get("content"))
        if content is None:
            return None
        role = message["role"]
        msg: dict[str, Any] = {"role": role, "content": content}
        calls = message.get("tool_calls")
        if role == "assistant" and isinstance(calls, list) and calls:
            msg["tool_calls"] = [_tool_call(call) for call in calls]
        if role == "assistant" and isinstance(message.get("reasoning"), str):
            msg["reasoning"] = msg["reasoning_content"] = message["reasoning"]
        if role == "tool" and "tool_call_id" in message:
            msg["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            msg["name"] = message["name"]
        out.append(msg)
    return out


def _text(content: Any) -> str | None:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        else:
            return None
    return "\n".join(texts)


def _tool_call(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    args = function.get("arguments")
    if isinstance(args, str) and args:
        try:
            args = json.loads(args)
        except ValueError:
            args = None
    function["arguments"] = args if isinstance(args, dict) else {}
    return {**call, "function": function}


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # older configs: {"content": "<s>", ...}
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' `tojson` filter (Jinja's own escapes HTML)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise TemplateError(message)
