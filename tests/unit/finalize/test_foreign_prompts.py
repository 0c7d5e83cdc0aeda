"""Level 3 on foreign prompts, tokenizer path: tools, multi-part and tool messages, completions
prompts, templates that fail, and a count that disagrees with the engine's."""

import json
from pathlib import Path
from typing import Any

import pytest
from test_tokens import TEMPLATE, word_tokenizer
from tokenizers import processors

from kvscope.finalize.divergence import with_divergence
from kvscope.finalize.provenance import build_ledger, provenance
from kvscope.probe.instrument import PromptInstrument
from kvscope.probe.tokens import ChatTokenizer, template_messages, token_hash
from kvscope.records.kv_events import KvBatch, KvEvent
from kvscope.records.tokens import PromptTokenIds

# A tool-using template in the style of Qwen's and Llama's: it reads `tools`, an assistant's
# `tool_calls` (arguments as a mapping) and `tool` messages.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %} call {{ c.function.name }}"
    "{% for k, v in c.function.arguments | dictsort %} {{ k }} {{ v }}{% endfor %}{% endfor %}"
    "{% endif %}{% if m.role == 'tool' %} for {{ m.tool_call_id }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = [f"w{i}" for i in range(50)] + ["Tools:", "call", "for", "get_weather", "city", "Paris"]
WORDS += ["c1", "<s>"]


def model_dir(path: Path, template: str, bos: bool = False) -> ChatTokenizer:
    tok = word_tokenizer()
    tok.add_tokens(WORDS)
    if bos:  # a tokenizer that adds BOS as a special token, as Llama's does
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (path / "chat_template.jinja").write_text(template)
    chat = ChatTokenizer.from_model_dir(path)
    assert chat is not None
    return chat


@pytest.fixture
def smol(tmp_path: Path) -> ChatTokenizer:
    return model_dir(tmp_path, TEMPLATE)


@pytest.fixture
def tooled(tmp_path: Path) -> ChatTokenizer:
    return model_dir(tmp_path, TOOLS_TEMPLATE)


class Sink(list[PromptTokenIds]):
    def ids(self) -> dict[str, tuple[int, ...]]:
        return {p.request_uuid: tuple(p.token_ids) for p in self}


def instrument(chat: ChatTokenizer | None, sink: Sink) -> PromptInstrument:
    return PromptInstrument(chat, sink.append, store_prompts=True)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
TOOL_TURN = [
    {"role": "user", "content": "w1 w2"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "w3 w4"},
]  # fmt: skip


def test_tools_tool_calls_and_tool_messages_reach_the_template(tooled: ChatTokenizer) -> None:
    sink = Sink()
    body = {"model": "m", "messages": TOOL_TURN, "tools": TOOLS}
    cols = instrument(tooled, sink)(body, "u1", {"fixed_messages": 1}, None, None)
    text = cols["serialized_prompt_text"]
    assert text == (
        "<|im_start|>system\nTools: get_weather<|im_end|>\n<|im_start|>user\nw1 w2<|im_end|>\n"
        "<|im_start|>assistant\n call get_weather city Paris<|im_end|>\n"
        "<|im_start|>tool\nw3 w4 for c1<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tuple(tooled.encode_text(text))
    assert sink.ids() == {"u1": ids} and tooled.tokenizer.token_to_id("Paris") in ids
    assert cols["prompt_token_source"] == "tokenizer" and cols["prompt_token_count"] == len(ids)
    assert cols["prompt_token_mismatch"] is None  # no engine count to compare with
    assert cols["token_id_hash"] == token_hash(ids)
    head = tooled.encode_text(tooled.render(template_messages(TOOL_TURN[:1]) or [], tools=TOOLS,
                                            generation_prompt=False))  # fmt: skip
    assert cols["fixed_prefix_tokens"] == len(head) < len(ids)
    assert cols["dynamic_suffix_tokens"] == len(ids) - len(head)
    assert TOOL_TURN[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # kept
    without = instrument(tooled, Sink())({"messages": TOOL_TURN}, "u2", {}, None, None)
    assert "Tools:" not in without["serialized_prompt_text"]  # `tools` absent: None


def test_multi_part_text_is_joined_like_vllm(smol: ChatTokenizer) -> None:
    parts = [{"type": "text", "text": "w1 w2"}, {"type": "text", "text": "w3"}]
    sink = Sink()
    run = instrument(smol, sink)
    a = run({"messages": [{"role": "user", "content": parts}]}, "a", {}, None, None)
    b = run({"messages": [{"role": "user", "content": "w1 w2\nw3"}]}, "b", {}, None, None)
    assert a["serialized_prompt_text"] == b["serialized_prompt_text"]
    assert sink.ids()["a"] == sink.ids()["b"]
    assert a["prompt_token_count"] == len(smol.encode_text(b["serialized_prompt_text"]))


def test_an_image_part_or_a_failing_template_means_no_ids(
    smol: ChatTokenizer, tmp_path: Path
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    sink = Sink()
    msgs = [{"role": "user", "content": [{"type": "text", "text": "w1"}, image]}]
    cols = instrument(smol, sink)({"messages": msgs}, "u", {}, None, 30)
    assert cols == {"raw_messages_json": json.dumps(msgs)} and sink == []
    (tmp_path / "bad").mkdir()
    bad = model_dir(tmp_path / "bad", "{{ raise_exception('no system role') }}")
    cols = instrument(bad, sink)({"messages": [{"role": "user", "content": "w1"}]}, "u", {},
                                 None, 30)  # fmt: skip
    assert "prompt_token_source" not in cols and sink == []
    (tmp_path / "strict").mkdir()
    strict = model_dir(tmp_path / "strict", "{{ messages[0].missing.deeper }}")
    assert "prompt_token_count" not in instrument(strict, sink)(
        {"messages": [{"role": "user", "content": "w1"}]}, "u", {}, None, 30
    )


def test_completions_prompt_string_gets_special_tokens_and_ids_are_taken_as_sent(
    tmp_path: Path,
) -> None:
    chat = model_dir(tmp_path, TEMPLATE, bos=True)
    sink = Sink()
    run = instrument(chat, sink)
    cols = run({"model": "m", "prompt": "w1 w2 w3"}, "s", {}, None, 4)
    bos = chat.tokenizer.token_to_id("<s>")
    assert sink.ids()["s"][0] == bos and len(sink.ids()["s"]) == 4
    assert sink.ids()["s"][1:] == tuple(chat.encode_text("w1 w2 w3"))
    assert cols["prompt_token_source"] == "tokenizer" and cols["prompt_token_mismatch"] is False
    # no fixed_messages hint: the fixed part is unknown, not 0
    assert cols["fixed_prefix_tokens"] is None and cols["dynamic_suffix_tokens"] is None
    cols = run({"model": "m", "prompt": "w1 w2 w3"}, "s", {"fixed_messages": 0}, None, 4)
    assert cols["fixed_prefix_tokens"] == 0 and cols["dynamic_suffix_tokens"] == 4
    cols = run({"model": "m", "prompt": [7, 8, 9]}, "i", {}, None, 3)
    assert sink.ids()["i"] == (7, 8, 9) and cols["prompt_token_source"] == "request"
    assert cols["prompt_hash"] is None and cols["token_id_hash"] == token_hash([7, 8, 9])
    batch = run({"model": "m", "prompt": ["w1", "w2"]}, "b", {}, None, 2)  # two prompts
    assert "prompt_token_source" not in batch and "b" not in sink.ids()


def test_engine_ids_win_and_the_fixed_prefix_still_comes_from_the_template(
    smol: ChatTokenizer,
) -> None:
    msgs = [{"role": "system", "content": "w1 w2 w3"}, {"role": "user", "content": "w4 w5"}]
    sink = Sink()
    mine = smol.prompt(msgs, fixed_messages=1)
    engine = list(mine.token_ids)
    cols = instrument(smol, sink)({"messages": msgs}, "e", {"fixed_messages": 1}, None,
                                  len(engine), engine)  # fmt: skip
    assert cols["prompt_token_source"] == "engine" and cols["prompt_token_mismatch"] is False
    assert cols["fixed_prefix_tokens"] == mine.fixed_prefix_tokens > 0
    assert cols["prompt_hash"] == mine.prompt_hash and sink.ids() == {"e": mine.token_ids}
    # no tokenizer at all: the engine's ids still make the row, without its text and prefix
    cols = instrument(None, sink)({"messages": msgs}, "n", {"fixed_messages": 1}, None, 20,
                                  list(range(20)))  # fmt: skip
    assert cols["prompt_token_source"] == "engine" and cols["prompt_token_count"] == 20
    assert cols["fixed_prefix_tokens"] is None and cols["prompt_hash"] is None


def test_a_count_that_disagrees_is_flagged_and_not_used(smol: ChatTokenizer) -> None:
    sink = Sink()
    msgs = [{"role": "user", "content": "w1 w2"}]
    cols = instrument(smol, sink)({"messages": msgs}, "m", {"fixed_messages": 1}, None, 999)
    assert cols["prompt_token_mismatch"] is True and cols["prompt_token_source"] == "tokenizer"
    assert cols["prompt_token_count"] == len(smol.prompt(msgs).token_ids) != 999
    for name in ("prompt_hash", "token_id_hash", "fixed_prefix_tokens", "dynamic_suffix_tokens"):
        assert name not in cols
    assert sink == []


def test_finalize_treats_a_row_without_ids_as_unmeasured() -> None:
    rows: list[dict[str, Any]] = [
        {"request_uuid": u, "workflow_run_id": "w", "agent_id": "a", "turn_id": 1,
         "previous_agent_id": None, "start_ns": t, "end_ns": t + 5, "status": "ok",
         "prompt_tokens": 8, "cached_tokens": 4, "queue_ms": None}
        for u, t in (("ok", 0), ("flagged", 10))
    ]  # fmt: skip
    tokens = {"ok": list(range(8))}  # the flagged row's ids were never written
    div = {r["request_uuid"]: r for r in with_divergence(rows, tokens)}
    assert div["ok"]["max_reusable_tokens"] == 0
    assert "max_reusable_tokens" not in div["flagged"]  # left null
    events = [
        (KvBatch(seq=0, ts_ns=1), KvEvent("stored", (1, 2), None, tuple(range(8)), 4, "GPU", "ok"))
    ]
    res = provenance(rows, tokens, build_ledger(events))
    flagged = next(r for r in res.rows if r["request_uuid"] == "flagged")
    assert flagged.get("cached_self_tokens") is None  # null, not 0
    assert res.skipped == {"no prompt tokens": 1}
