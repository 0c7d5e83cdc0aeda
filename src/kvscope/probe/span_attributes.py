"""The attributes of an LLM call's MLflow span, from its request row: one mapping for the spans
kvscope writes at publish (kvscope/traces.py) and the app's own spans it annotates live
(probe/app_spans.py).

Three families, side by side on every LLM span (a column that is None is left off, never 0):
- the design note's names (its instrumented-client example: `benchmark.run_id`, `thread.id`,
  `workflow.run_id`, `agent.id`, `agent.previous_id`, `agent.turn_id`, `request.uuid`,
  `model.name`, `request.sglang_response_id`, `prompt.*`, `output.tokens`, `latency.*`, and the
  list of its MLflow section: `workflow.id`, `kv.prompt_tokens`, `kv.cached_tokens`,
  `kv.new_prefill_tokens`, `kv.cache_hit_ratio`);
- the OpenTelemetry GenAI names other tools read (`gen_ai.usage.input_tokens`,
  `gen_ai.usage.output_tokens`, `gen_ai.usage.cache_read.input_tokens`, `gen_ai.agent.name`,
  `gen_ai.conversation.id`, `gen_ai.request.model`, `gen_ai.response.id`,
  `gen_ai.response.finish_reasons`);
- kvscope's own measures under `kv.*`: provenance of the cached tokens and causes of the
  uncached ones (`kv.cached_self_tokens`, ..., `kv.uncached_cold_tokens`), prompt structure
  (`kv.fixed_prefix_tokens`, `kv.first_divergence_*`, `kv.max_reusable_tokens`) and the server's
  KV state around the call (`kv.cache_used_tokens_before`, ...); plus `graph.node`,
  `thread.turn`, `server.*` and `prompt.*`/`result.*` for the remaining row columns.

`mlflow.chat.tokenUsage` (MLflow's own token summary) comes from `token_usage`.
"""

from collections.abc import Mapping
from typing import Any

TOKEN_USAGE_KEY = "mlflow.chat.tokenUsage"

# span attribute <- request row column
LLM_ATTRIBUTES: dict[str, str] = {
    # design note: identity
    "benchmark.run_id": "benchmark_run_id",
    "thread.id": "thread_id",
    "workflow.run_id": "workflow_run_id",
    "workflow.id": "workflow_run_id",
    "workflow.type": "workflow_type",
    "agent.id": "agent_id",
    "agent.previous_id": "previous_agent_id",
    "agent.turn_id": "turn_id",
    "request.uuid": "request_uuid",
    "model.name": "model_name",
    "request.sglang_response_id": "sglang_response_id",
    # design note: tokens and cache
    "prompt.tokens": "prompt_tokens",
    "prompt.cached_tokens": "cached_tokens",
    "prompt.new_prefill_tokens": "new_prefill_tokens",
    "prompt.reported_cache_hit_ratio": "reported_cache_hit_ratio",
    "output.tokens": "output_tokens",
    "kv.prompt_tokens": "prompt_tokens",
    "kv.cached_tokens": "cached_tokens",
    "kv.new_prefill_tokens": "new_prefill_tokens",
    "kv.cache_hit_ratio": "reported_cache_hit_ratio",
    # design note: timing and result
    "latency.queue_ms": "queue_ms",
    "latency.ttft_ms": "ttft_ms",
    "latency.tpot_ms": "tpot_ms",
    "latency.prefill_ms": "prefill_ms",
    "latency.decode_ms": "decode_ms",
    "latency.e2e_ms": "e2e_ms",
    "tool.ms": "tool_ms",
    "result.status": "status",
    "result.error_type": "error_type",
    "result.error_message": "error_message",
    "result.finish_reason": "finish_reason",
    # OpenTelemetry GenAI
    "gen_ai.usage.input_tokens": "prompt_tokens",
    "gen_ai.usage.output_tokens": "output_tokens",
    "gen_ai.usage.cache_read.input_tokens": "cached_tokens",
    "gen_ai.agent.name": "agent_id",
    "gen_ai.conversation.id": "thread_id",
    "gen_ai.request.model": "model_name",
    "gen_ai.response.id": "sglang_response_id",
    # kvscope: where the cached tokens came from, why the rest was computed (finalize)
    "kv.cached_self_tokens": "cached_self_tokens",
    "kv.cached_cross_agent_tokens": "cached_cross_agent_tokens",
    "kv.cached_cross_workflow_tokens": "cached_cross_workflow_tokens",
    "kv.cached_unattributed_tokens": "cached_unattributed_tokens",
    "kv.uncached_evicted_tokens": "uncached_evicted_tokens",
    "kv.uncached_layout_tokens": "uncached_layout_tokens",
    "kv.uncached_cold_tokens": "uncached_cold_tokens",
    # kvscope: prompt structure
    "kv.fixed_prefix_tokens": "fixed_prefix_tokens",
    "kv.dynamic_suffix_tokens": "dynamic_suffix_tokens",
    "kv.first_divergence_same_agent": "first_divergence_same_agent",
    "kv.first_divergence_previous_agent": "first_divergence_previous_agent",
    "kv.max_reusable_tokens": "max_reusable_tokens",
    # kvscope: the server's KV state around the call (Level 2 context)
    "kv.cache_used_tokens_before": "cache_used_tokens_before",
    "kv.cache_used_tokens_after": "cache_used_tokens_after",
    "kv.cache_utilization_before": "cache_utilization_before",
    "kv.cache_utilization_after": "cache_utilization_after",
    "server.running_requests": "running_requests",
    "server.queued_requests": "queued_requests",
    # kvscope: where in the graph, and the prompt's identity
    "graph.node": "graph_node",
    "thread.turn": "thread_turn",
    "prompt.hash": "prompt_hash",
    "prompt.token_id_hash": "token_id_hash",
    "prompt.template_version": "prompt_template_version",
    "prompt.layout": "prompt_layout",
}


def llm_attributes(row: Mapping[str, Any]) -> dict[str, Any]:
    """The LLM span's attributes for one request row (a dict of RequestRecord's columns, or a
    finalized table row); columns the row lacks or holds None are left off."""
    out = {a: row.get(c) for a, c in LLM_ATTRIBUTES.items()}
    out = {a: v for a, v in out.items() if v is not None}
    if (reason := row.get("finish_reason")) is not None:
        out["gen_ai.response.finish_reasons"] = [reason]
    return out


def token_usage(row: Mapping[str, Any]) -> dict[str, int]:
    """`mlflow.chat.tokenUsage` from what the engine reported (only the known keys)."""
    prompt, output = row.get("prompt_tokens"), row.get("output_tokens")
    cached = row.get("cached_tokens")
    usage: dict[str, int] = {}
    if prompt is not None:
        usage["input_tokens"] = int(prompt)
    if output is not None:
        usage["output_tokens"] = int(output)
    if prompt is not None and output is not None:
        usage["total_tokens"] = int(prompt) + int(output)
    if cached is not None:
        usage["cache_read_input_tokens"] = int(cached)
    return usage
