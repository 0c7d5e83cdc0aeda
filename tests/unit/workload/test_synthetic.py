from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kvscope.config import SyntheticConfig
from kvscope.workload.prompts import AGENTS
from kvscope.workload.synthetic import SYNTHETIC_TEMPLATE_VERSION, SyntheticPrompts

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER = Path.home() / ".cache/kvscope/models/SmolLM2-135M-Instruct/tokenizer.json"
pytestmark = pytest.mark.skipif(not TOKENIZER.is_file(), reason="SmolLM2 tokenizer not downloaded")


@pytest.fixture(scope="module")
def tok() -> "Tokenizer":
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))


def _chatml(messages: list[dict[str, str]]) -> str:
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


@pytest.mark.parametrize(("fixed", "dynamic"), [(16, 1), (512, 32), (1024, 256), (4096, 7)])
def test_lengths_are_exact(tok: "Tokenizer", fixed: int, dynamic: int) -> None:
    synth = SyntheticPrompts(tok, SyntheticConfig(fixed_tokens=fixed, dynamic_tokens=dynamic))
    empty = len(
        tok.encode(
            _chatml([{"role": "system", "content": ""}, {"role": "user", "content": ""}])
        ).ids
    )
    for agent in AGENTS:
        messages = synth.messages(agent, workflow_index=3, turn_id=2)
        assert synth.count(messages[0]["content"]) == fixed
        assert synth.count(messages[1]["content"]) == dynamic
        # The counts hold inside the chat template too: nothing merges across its boundaries.
        assert len(tok.encode(_chatml(messages)).ids) == empty + fixed + dynamic


def test_deterministic_with_the_seed(tok: "Tokenizer") -> None:
    lengths = SyntheticConfig(fixed_tokens=64, dynamic_tokens=16)
    a, b = SyntheticPrompts(tok, lengths, seed=7), SyntheticPrompts(tok, lengths, seed=7)
    other = SyntheticPrompts(tok, lengths, seed=8)
    assert a.messages("planner", 0, 1) == b.messages("planner", 0, 1)
    assert a.messages("planner", 0, 1) != other.messages("planner", 0, 1)


def test_fixed_is_per_agent_and_dynamic_per_call(tok: "Tokenizer") -> None:
    synth = SyntheticPrompts(tok, SyntheticConfig(fixed_tokens=64, dynamic_tokens=16))
    fixed = {agent: synth.fixed_prompt(agent) for agent in AGENTS}
    assert len(set(fixed.values())) == 4
    assert synth.messages("executor", 5, 3)[0]["content"] == fixed["executor"]
    suffixes = {
        synth.dynamic_suffix(agent, wf, turn)
        for agent in AGENTS
        for wf in range(2)
        for turn in (1, 2)
    }
    assert len(suffixes) == 16


def test_fixed_can_be_private_to_each_workflow(tok: "Tokenizer") -> None:
    lengths = SyntheticConfig(fixed_tokens=32, dynamic_tokens=4)
    private = SyntheticPrompts(tok, lengths, share_fixed=False)
    assert private.fixed_prompt("planner", 0) != private.fixed_prompt("planner", 1)
    assert private.fixed_prompt("planner", 1) == private.messages("planner", 1, 2)[0]["content"]


def test_prompt_info(tok: "Tokenizer") -> None:
    info = SyntheticPrompts(tok, SyntheticConfig()).prompt_info
    assert (info.template_version, info.layout) == (SYNTHETIC_TEMPLATE_VERSION, "synthetic")
