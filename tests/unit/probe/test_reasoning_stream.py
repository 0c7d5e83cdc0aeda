"""A reasoning model's stream (vLLM's and SGLang's reasoning parsers): the first deltas carry
`reasoning_content` (newer vLLM: `reasoning`), not `content`. TTFT is to the first generated
token of either kind, TPOT spans both, and the reasoning tokens the engine reports get their own
column. On the stand-in vLLM (its recorded stream, the first content deltas turned into
reasoning), every byte still reaches the app."""

import json
from typing import Any

import httpx2
import openai
import pytest
from vllm_stub import USAGE, Stub

from kvscope.config import EngineConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.intercept import Interceptor
from kvscope.probe.measure import Seen, measured
from kvscope.probe.wire import CallContext
from kvscope.records.requests import RequestRecord

BASE = "http://engine:8000"
THOUGHTS = 3  # content deltas turned into reasoning
DELAY_S = 0.1


class Reasoning(Stub):
    def __init__(self, field: str, reported: int | None) -> None:
        super().__init__(delay_s=DELAY_S)
        self.field, self.reported = field, reported

    def events(self, path: str, body: dict[str, Any]) -> list[str]:
        out, turned = [], 0
        for event in super().events(path, body):
            chunk = json.loads(event[6:]) if event.startswith("data: {") else None
            delta = chunk and chunk["choices"] and chunk["choices"][0].get("delta")
            if delta and delta.get("content") and turned < THOUGHTS:
                delta[self.field] = delta.pop("content")
                turned += 1
            if chunk and chunk.get("usage") and self.reported is not None:
                chunk["usage"]["completion_tokens_details"] = {"reasoning_tokens": self.reported}
            out.append(event if chunk is None else "data: " + json.dumps(chunk) + "\n\n")
        return out


@pytest.mark.parametrize(("field", "reported"), [("reasoning_content", 3), ("reasoning", None)])
def test_ttft_counts_the_first_reasoning_token(field: str, reported: int | None) -> None:
    rows: list[RequestRecord] = []
    ctx = CallContext("bench-1", "exp", "hash", "langgraph", 1, "smollm2", None, rows.append)
    stub = Reasoning(field, reported)
    http = httpx2.Client(transport=stub.transport(httpx2))
    client = openai.OpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http, max_retries=0)
    with Interceptor(VllmEngine(EngineConfig()), BASE, ctx):
        chunks = [
            c.model_dump()
            for c in client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        ]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert sum(bool(d.get(field)) for d in deltas) == THOUGHTS  # the app got its reasoning
    [r] = rows
    assert r.status == "ok" and r.output_tokens == USAGE["usage"]["completion_tokens"]
    # events are DELAY_S apart: the first content token comes after THOUGHTS more of them
    assert r.ttft_ms is not None and r.ttft_ms < (THOUGHTS + 1) * DELAY_S * 1000 - 50
    assert r.tpot_ms is not None
    assert r.reasoning_tokens == reported


def test_reasoning_then_content_timings_on_hand_made_chunks() -> None:
    seen = Seen()
    seen.take_chunk({"choices": [{"delta": {"reasoning_content": "hm"}}]}, now=1.0)
    seen.take_chunk({"choices": [{"delta": {"reasoning": " so"}}]}, now=1.5)
    seen.take_chunk({"choices": [{"delta": {"content": "Yes"}}]}, now=2.0)
    usage = {"prompt_tokens": 10, "completion_tokens": 3,
             "completion_tokens_details": {"reasoning_tokens": 2}}  # fmt: skip
    seen.take_chunk({"choices": [], "usage": usage}, now=2.1)
    cols = measured(seen, t0=0.5, t_end=2.2, start_ns=0)
    assert seen.content == "Yes"  # the reply's text is the content alone
    assert cols["ttft_ms"] == pytest.approx(500)
    assert cols["tpot_ms"] == pytest.approx(500)  # (2.0 - 1.0) s over 2 intervals
    assert (cols["output_tokens"], cols["reasoning_tokens"]) == (3, 2)
    assert cols["cached_tokens"] is None  # not reported: unknown, not 0
