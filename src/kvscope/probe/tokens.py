"""The exact token sequence a prompt becomes: the model's own chat template and tokenizer.

Cache reuse depends on the final tokens, not on the text a human sees (design note, Phase 7), so
kvscope renders the model's chat template (Jinja, as Hugging Face's apply_chat_template does)
and encodes the result with the model's tokenizer. The embedded engine reports its own prompt
token count on every call; a row whose count differs is flagged, never silently used.
"""

import hashlib
import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import StrictUndefined
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from kvscope.records.tokens import common_prefix

Messages = Sequence[dict[str, str]]


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
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=StrictUndefined,
            extensions=["jinja2.ext.loopcontrols"],
        )  # fmt: skip
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False)
        self.tokenizer = tokenizer
        self.template = env.from_string(template)
        self.special = special

    @classmethod
    def from_model_dir(cls, path: Path) -> "ChatTokenizer | None":
        """The tokenizer and chat template of a Hugging Face model folder; None if incomplete."""
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
        return cls(Tokenizer.from_file(str(tok)), template, special)

    def render(self, messages: Messages, *, generation_prompt: bool = True) -> str:
        return self.template.render(
            messages=list(messages), add_generation_prompt=generation_prompt, **self.special
        )

    def encode_text(self, text: str) -> list[int]:
        # The template already wrote the special tokens (as HF's apply_chat_template assumes).
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def prompt(self, messages: Messages, fixed_messages: int = 0) -> PromptTokens:
        text = self.render(messages)
        ids = tuple(self.encode_text(text))
        fixed = 0
        if 0 < fixed_messages < len(messages):
            head = self.encode_text(self.render(messages[:fixed_messages], generation_prompt=False))
            fixed = common_prefix(ids, head)
        elif fixed_messages >= len(messages):
            fixed = len(ids)
        return PromptTokens(ids, text, fixed)


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # older configs: {"content": "<s>", ...}
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _raise(message: str) -> None:
    raise TemplateError(message)
