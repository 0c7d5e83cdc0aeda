"""The profiled client: one streamed OpenAI-compatible call -> one canonical RequestRecord.

Timings and usage are read as probe/measure.py defines them (TTFT, TPOT, e2e; usage from the final
stream chunk); what the engine did not report stays None.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import openai

from kvscope.collect.context import with_server_timings
from kvscope.engines.base import Engine
from kvscope.probe.measure import CALL_ERRORS, Seen, failure, measured
from kvscope.probe.tokens import ChatTokenizer
from kvscope.records.requests import STATUS_ERROR, STATUS_OK, RequestRecord
from kvscope.records.tokens import PromptTokenIds
from kvscope.workload.runtime import CallIds, LlmCall, PromptInfo


@dataclass(frozen=True)
class RunInfo:
    """Per-run constants that every row carries."""

    experiment_name: str
    configuration_hash: str
    workflow_type: str
    workflow_concurrency: int | None
    model_name: str
    chat_template_name: str | None


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
        seen = Seen()
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
                seen.take_chunk(chunk.model_dump(), time.perf_counter())
            if seen.usage is None:
                status, error_type = STATUS_ERROR, "incomplete_stream"
                error_message = "the stream ended without a usage chunk"
        except CALL_ERRORS as err:
            status, error_type, error_message = failure(err)
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
        seen: Seen,
        t0: float,
        t_end: float,
        start_ns: int,
        tool_ms: float | None,
    ) -> RequestRecord:
        return RequestRecord(
            benchmark_run_id=ids.benchmark_run_id,
            experiment_name=self.run.experiment_name,
            configuration_hash=self.run.configuration_hash,
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
            tool_ms=tool_ms,
            prompt_template_version=prompt.template_version,
            chat_template_name=self.run.chat_template_name,
            prompt_layout=prompt.layout,
            sharing_mode=prompt.sharing,
            status=STATUS_OK,
            **measured(seen, t0, t_end, start_ns),
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
