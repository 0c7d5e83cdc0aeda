"""The profiled client: one streamed OpenAI-compatible call -> one canonical RequestRecord.

Timings follow the design note: TTFT from submission to the first content token, TPOT between
first and last content token over (output_tokens - 1), e2e to the end of the stream. Usage comes
from the final stream chunk; what the engine did not report stays None.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import httpx
import openai

from kvscope.collect.context import with_server_timings
from kvscope.engines.base import Engine
from kvscope.probe.tokens import ChatTokenizer
from kvscope.records.requests import (
    STATUS_ERROR,
    STATUS_OK,
    STATUS_TIMEOUT,
    RequestRecord,
    derived_cache,
)
from kvscope.records.tokens import PromptTokenIds
from kvscope.workload.runtime import CallIds, LlmCall, PromptInfo


@dataclass(frozen=True)
class RunInfo:
    """Per-run constants that every row carries."""

    experiment_name: str
    configuration_hash: str
    workflow_type: str
    workflow_concurrency: int
    model_name: str
    chat_template_name: str | None


@dataclass
class _Stream:
    first_token: float | None = None
    last_token: float | None = None
    content: str = ""
    usage: dict[str, Any] | None = None
    final: dict[str, Any] | None = None  # the usage chunk, with any engine extras
    finish_reason: str | None = None
    response_id: str | None = None


class Probe:
    def __init__(
        self,
        engine: Engine,
        base_url: str,
        run: RunInfo,
        *,
        timeout_s: float,
        sink: Callable[[RequestRecord], None],
        tokens: ChatTokenizer | None = None,
        token_sink: Callable[[PromptTokenIds], None] | None = None,
        store_prompts: bool = False,
    ) -> None:
        self.engine = engine
        self.run = run
        self.sink = sink
        self.tokens, self.token_sink, self.store_prompts = tokens, token_sink, store_prompts
        self.client = openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0, timeout=timeout_s
        )

    async def call(self, call: LlmCall, request_uuid: str) -> tuple[RequestRecord, str | None]:
        """Send one request; always returns (and sinks) a row, also when the call failed."""
        messages, ids, prompt = call.messages, call.ids, call.prompt
        instrumented = self._instrument(messages, prompt, request_uuid)
        body, headers = self.engine.request_tags(request_uuid, ids.agent_id)
        if call.ignore_eos:
            body["ignore_eos"] = True
        seen = _Stream()
        status, error_type, error_message = STATUS_OK, None, None
        start_ns = time.time_ns()
        t0 = time.perf_counter()
        try:
            stream = await self.client.chat.completions.create(
                model=self.run.model_name,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=call.max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=body,
                extra_headers=headers,
            )
            async for chunk in stream:
                _take(seen, chunk.model_dump(), time.perf_counter())
            if seen.usage is None:
                status, error_type = STATUS_ERROR, "incomplete_stream"
                error_message = "the stream ended without a usage chunk"
        except (openai.APITimeoutError, httpx.TimeoutException) as err:
            status, error_type, error_message = STATUS_TIMEOUT, "timeout", str(err)
        except openai.APIStatusError as err:
            status, error_type = STATUS_ERROR, f"http_{err.status_code}"
            error_message = _short(err.message)
        except (openai.APIConnectionError, httpx.TransportError) as err:
            status, error_type, error_message = STATUS_ERROR, "connection", _short(str(err))
        except (json.JSONDecodeError, ValueError, KeyError, TypeError) as err:
            status, error_type = STATUS_ERROR, "malformed_stream"
            error_message = _short(f"{type(err).__name__}: {err}")
        t_end = time.perf_counter()
        record = self._record(ids, request_uuid, prompt, seen, t0, t_end, start_ns, call.tool_ms)
        record = with_server_timings(record, self.engine.server_timings(seen.final))
        record = replace(record, **instrumented)
        if status != STATUS_OK:
            record = replace(
                record, status=status, error_type=error_type, error_message=error_message
            )
        self.sink(record)
        return record, seen.content if status == STATUS_OK else None

    def _record(
        self,
        ids: CallIds,
        request_uuid: str,
        prompt: PromptInfo,
        s: _Stream,
        t0: float,
        t_end: float,
        start_ns: int,
        tool_ms: float | None,
    ) -> RequestRecord:
        usage = s.usage or {}
        prompt_tokens = usage.get("prompt_tokens")
        output_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        new_prefill, ratio = derived_cache(prompt_tokens, cached)
        ttft = None if s.first_token is None else (s.first_token - t0) * 1000
        tpot = None
        if s.first_token is not None and s.last_token is not None and (output_tokens or 0) > 1:
            tpot = (s.last_token - s.first_token) * 1000 / (output_tokens - 1)
        return RequestRecord(
            benchmark_run_id=ids.benchmark_run_id,
            experiment_name=self.run.experiment_name,
            configuration_hash=self.run.configuration_hash,
            timestamp=datetime.fromtimestamp(start_ns / 1e9, UTC).isoformat(),
            thread_id=ids.thread_id,
            workflow_run_id=ids.workflow_run_id,
            workflow_type=self.run.workflow_type,
            workflow_concurrency=self.run.workflow_concurrency,
            turn_id=ids.turn_id,
            agent_id=ids.agent_id,
            previous_agent_id=ids.previous_agent_id,
            graph_node=ids.graph_node,
            request_uuid=request_uuid,
            model_name=self.run.model_name,
            sglang_response_id=s.response_id,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            cached_tokens=cached,
            new_prefill_tokens=new_prefill,
            reported_cache_hit_ratio=ratio,
            ttft_ms=ttft,
            tpot_ms=tpot,
            e2e_ms=(t_end - t0) * 1000,
            tool_ms=tool_ms,
            prompt_template_version=prompt.template_version,
            chat_template_name=self.run.chat_template_name,
            prompt_layout=prompt.layout,
            sharing_mode=prompt.sharing,
            status=STATUS_OK,
            finish_reason=s.finish_reason,
            start_ns=start_ns,
            end_ns=start_ns + int((t_end - t0) * 1e9),
        )

    def _instrument(
        self, messages: list[dict[str, str]], prompt: PromptInfo, request_uuid: str
    ) -> dict[str, Any]:
        """Phase 7 columns from the model's own chat template and tokenizer (before sending)."""
        out: dict[str, Any] = {}
        if self.store_prompts:
            out["raw_messages_json"] = json.dumps(messages, ensure_ascii=False)
        if self.tokens is None:
            return out
        pt = self.tokens.prompt(messages, prompt.fixed_messages)
        if self.token_sink is not None:
            self.token_sink(PromptTokenIds(request_uuid, pt.token_ids))
        out |= {
            "prompt_hash": pt.prompt_hash,
            "token_id_hash": pt.token_id_hash,
            "fixed_prefix_tokens": pt.fixed_prefix_tokens,
            "dynamic_suffix_tokens": len(pt.token_ids) - pt.fixed_prefix_tokens,
        }
        if self.store_prompts:
            out["serialized_prompt_text"] = pt.text
        return out

    async def close(self) -> None:
        await self.client.close()


def _take(s: _Stream, chunk: dict[str, Any], now: float) -> None:
    s.response_id = s.response_id or chunk.get("id")
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            if s.first_token is None:
                s.first_token = now
            s.last_token = now
            s.content += delta["content"]
        if choice.get("finish_reason"):
            s.finish_reason = choice["finish_reason"]
    if chunk.get("usage"):
        s.usage = chunk["usage"]
        s.final = chunk


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
