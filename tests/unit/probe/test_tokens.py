"""Prompt instrumentation: chat template rendering, fixed prefix, divergence indexes."""

import json
from pathlib import Path

import numpy as np
import pytest
from oracles import PrefixIndex
from tokenizers import Tokenizer, models, pre_tokenizers

from kvscope.finalize.divergence import with_divergence
from kvscope.probe.tokens import ChatTokenizer, token_hash
from kvscope.records.metrics import instant_series_jsonl
from kvscope.records.tokens import TOKENS_JSONL, common_prefix, load_tokens

# SmolLM2-135M-Instruct's chat template, as the model folder ships it.
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def word_tokenizer() -> Tokenizer:
    """One token per whitespace-separated word: token counts that a test can check by eye."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]", vocab={"[UNK]": 0}))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


@pytest.fixture
def chat(tmp_path: Path) -> ChatTokenizer:
    tok = word_tokenizer()
    tok.add_tokens([f"w{i}" for i in range(50)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    c = ChatTokenizer.from_model_dir(tmp_path)
    assert c is not None
    return c


def test_renders_the_models_template(chat: ChatTokenizer) -> None:
    msgs = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3"}]
    text = chat.render(msgs)
    assert text == (
        "<|im_start|>system\nw1 w2<|im_end|>\n<|im_start|>user\nw3<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert "SmolLM" in chat.render([{"role": "user", "content": "w3"}])  # default system


def test_fixed_prefix_ends_with_the_fixed_messages(chat: ChatTokenizer) -> None:
    msgs = [{"role": "system", "content": "w1 w2 w3"}, {"role": "user", "content": "w4 w5"}]
    p = chat.prompt(msgs, fixed_messages=1)
    head = chat.encode_text(chat.render(msgs[:1], generation_prompt=False))
    assert p.fixed_prefix_tokens == len(head) and list(p.token_ids[: len(head)]) == head
    assert 0 < p.fixed_prefix_tokens < len(p.token_ids)
    assert p.token_id_hash == token_hash(p.token_ids) and len(p.prompt_hash) == 16
    other = chat.prompt([msgs[0], {"role": "user", "content": "w6"}], fixed_messages=1)
    assert other.fixed_prefix_tokens == p.fixed_prefix_tokens
    assert other.token_id_hash != p.token_id_hash


def test_no_model_folder_means_no_tokenizer(tmp_path: Path) -> None:
    assert ChatTokenizer.from_model_dir(tmp_path) is None


def test_common_prefix_and_index() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0
    index = PrefixIndex()
    assert index.longest([1, 2, 3]) == 0
    for seq in ([1, 2, 3, 4], [1, 5], [7, 7, 7], [1, 2, 9]):
        index.add(seq)
    assert index.longest([1, 2, 3, 8]) == 3
    assert index.longest([1, 5, 6]) == 2
    assert index.longest([7, 7]) == 2 and index.longest([8]) == 0


def test_divergence_columns() -> None:
    def row(uuid: str, wf: str, agent: str, start: int) -> dict:
        return {"request_uuid": uuid, "workflow_run_id": wf, "agent_id": agent, "start_ns": start}

    rows = [row("p1", "w", "planner", 0), row("e1", "w", "executor", 1),
            row("p2", "w", "planner", 2), row("q1", "v", "planner", 3)]  # fmt: skip
    tokens = {"p1": [1, 2, 3, 4], "e1": [1, 2, 9, 9], "p2": [1, 2, 3, 5], "q1": [1, 2, 3, 4, 6]}
    out = {r["request_uuid"]: r for r in with_divergence(rows, tokens)}
    assert out["p1"]["first_divergence_same_agent"] is None
    assert out["p1"]["max_reusable_tokens"] == 0
    assert out["e1"]["first_divergence_previous_agent"] == 2
    assert out["e1"]["first_divergence_same_agent"] is None
    assert (
        out["p2"]["first_divergence_same_agent"],
        out["p2"]["first_divergence_previous_agent"],
    ) == (3, 2)
    assert out["p2"]["max_reusable_tokens"] == 3
    # Another workflow: no previous call of its own, but the run held its whole prefix.
    assert out["q1"]["first_divergence_previous_agent"] is None
    assert out["q1"]["max_reusable_tokens"] == 4


def test_instant_series_jsonl_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        json.dumps({"ts": 2, "values": {"kv_used_tokens": 10.0}}) + "\n"
        + json.dumps({"ts": 1, "values": {"kv_used_tokens": 5.0, "running_requests": 1}}) + "\n"
        + '{"ts": 3, "val'
    )  # fmt: skip
    series = instant_series_jsonl(path)
    assert series == {"kv_used_tokens": [(1, 5.0), (2, 10.0)], "running_requests": [(1, 1)]}


def test_load_tokens_as_int_arrays(tmp_path: Path) -> None:
    lines = [
        {"request_uuid": "a", "token_ids": [1, 2, 3]},
        {"request_uuid": "b", "token_ids": []},
        {"request_uuid": "a", "token_ids": [4]},  # written twice: the last line counts
    ]
    path = tmp_path / TOKENS_JSONL
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = load_tokens(tmp_path)
    assert {u: a.tolist() for u, a in got.items()} == {"a": [4], "b": []}
    assert got["a"].dtype == got["b"].dtype == np.uint16  # every id in [0, 2**16)
    path.write_text(json.dumps({"request_uuid": "c", "token_ids": [70_000, 1]}) + "\n")
    assert load_tokens(tmp_path)["c"].dtype == np.int32  # too wide for uint16: int32
    path.write_text(json.dumps({"request_uuid": "c", "token_ids": [2**40]}) + "\n")
    assert load_tokens(tmp_path)["c"].tolist() == [2**40]  # too wide for int32: int64
    assert load_tokens(tmp_path / "none") == {}


REPLIED = [
    {"role": "system", "content": "w1 w2"},
    {"role": "user", "content": "w3"},
    {"role": "assistant", "content": "w4 w5", "name": "writer"},
]


def test_a_trailing_assistant_message_is_rendered_as_the_engine_serves_it(
    chat: ChatTokenizer,
) -> None:
    """SGLang serves a conversation that ends with an assistant message as if that message were
    the user's (Engine.chat_trailing_assistant_as_user), unless the call continues it."""
    assert chat.as_served(REPLIED, {}) is REPLIED  # vLLM's way: as written
    chat.trailing_assistant_as_user = True
    served = chat.as_served(REPLIED, {})
    assert served[:2] == REPLIED[:2] and served[2] == {"role": "user", "content": "w4 w5"}
    assert REPLIED[2]["role"] == "assistant"  # the app's messages are not changed
    assert "<|im_start|>user\nw4 w5<|im_end|>\n<|im_start|>assistant\n" in chat.render(served)
    assert chat.as_served(REPLIED, {"continue_final_message": True}) is REPLIED
    middle = [*REPLIED, {"role": "user", "content": "w6"}]
    assert chat.as_served(middle, {}) is middle
    assert chat.as_served([], {}) == []
