"""kvscope's own tokenization of a chat (the fallback where SGLang's ids are not returned) gives
the ids the live SGLang server itself reports for the same call, conversations that end with an
assistant message included: SGLang serves that message as the user's
(Engine.chat_trailing_assistant_as_user), and so must the fallback."""

from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import Up

from kvscope.config import EngineConfig
from kvscope.engines import make_engine
from kvscope.probe.tokens import ChatTokenizer, template_messages

pytestmark = pytest.mark.engine

SYSTEM = {"role": "system", "content": "You are the supervisor of a research team."}
ASK = {"role": "user", "content": "Find three facts about the moon."}
DONE = {"role": "assistant", "content": "The moon is 384,400 km away.\n\nIt has no air."}
CONVERSATIONS = {
    "ends with the user": [SYSTEM, ASK],
    "ends with an assistant": [SYSTEM, ASK, DONE],
    "an assistant in the middle": [SYSTEM, ASK, DONE, {"role": "user", "content": "Next?"}],
    "ends with a named assistant": [ASK, {**DONE, "name": "researcher"}],
}


def _served_ids(base: str, model: str, messages: list[dict[str, Any]], engine: Any) -> list[int]:
    body = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0}
    reply = httpx.post(f"{base}/v1/chat/completions", json=body | engine.prompt_ids_fields(body),
                       timeout=120).raise_for_status().json()  # fmt: skip
    ids = engine.reply_prompt_ids(reply)
    assert ids, reply
    return ids


def test_the_fallback_tokenizes_each_chat_as_sglang_serves_it(sglang: Up) -> None:
    engine = make_engine(EngineConfig.model_validate(sglang.engine_config))
    assert engine.chat_trailing_assistant_as_user
    model = httpx.get(f"{sglang.base}/v1/models", timeout=30).json()["data"][0]["id"]
    folder = Path(engine.model_facts()["path"])
    served_as = ChatTokenizer.from_model_dir(folder, trailing_assistant_as_user=True)
    as_written = ChatTokenizer.from_model_dir(folder)
    assert served_as is not None and as_written is not None
    differs = []
    for name, messages in CONVERSATIONS.items():
        served = _served_ids(sglang.base, model, messages, engine)
        msgs = template_messages(messages)
        assert msgs is not None
        ours = served_as.encode_text(served_as.render(served_as.as_served(msgs, {})))
        assert ours == served, name
        plain = as_written.encode_text(as_written.render(as_written.as_served(msgs, {})))
        if plain != served:
            differs.append(name)
    assert differs == ["ends with an assistant", "ends with a named assistant"]  # the trait's use
