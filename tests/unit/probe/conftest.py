"""Fixtures of the probe's tests."""

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from kvscope.probe.tokens import ChatTokenizer

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def chat(tmp_path: Path) -> ChatTokenizer:
    """A word-level tokenizer of w0..w49 and the role tags, with a one-line chat template, read
    from a model folder as kvscope reads an engine's."""
    return make_chat(tmp_path)


def make_chat(tmp_path: Path, **options: bool) -> ChatTokenizer:
    """The `chat` fixture's tokenizer, in tmp_path/model (`options`: from_model_dir's)."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]", vocab={"[UNK]": 0}))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_tokens([f"w{i}" for i in range(50)] + ["<|system|>", "<|user|>", "<|assistant|>"])
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    made = ChatTokenizer.from_model_dir(folder, **options)
    assert made is not None and made.model_dir == folder
    return made
