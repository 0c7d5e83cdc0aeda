"""The columns of the report's tables: analysis column, header, and how its values are shown."""

from kvscope.analysis import latency
from kvscope.records import requests as records
from kvscope.report.table import Column

CACHE_COLUMNS = (
    Column("calls", "calls"),
    Column("failed", "failed"),
    Column("prompt_tokens", "prompt tokens"),
    Column("cached_tokens", "cached tokens"),
    Column("weighted_hit_ratio", "weighted hit", "ratio"),
    Column("recompute_burden", "recompute burden"),
    Column("ttft_p50_ms", "TTFT p50 ms", "ms"),
)
AGENT_COLUMNS = (
    Column("agent_id", "agent", "text"),
    Column("calls", "calls"),
    Column("failed", "failed"),
    Column("prompt_tokens_p50", "prompt p50"),
    Column("cached_tokens_p50", "cached p50"),
    Column("new_prefill_tokens_p50", "new prefill p50"),
    Column("weighted_hit_ratio", "weighted hit", "ratio"),
    Column("new_prefill_tokens", "recompute burden"),
    Column("ttft_p50_ms", "TTFT p50 ms", "ms"),
    Column("ttft_p95_ms", "TTFT p95 ms", "ms"),
    Column("tpot_p50_ms", "TPOT p50 ms", "ms"),
    Column("e2e_p50_ms", "e2e p50 ms", "ms"),
    Column("tool_ms", "tool ms", "ms"),
)
TURN_COLUMNS = (Column("agent_id", "agent", "text"), Column("turn_id", "turn"), *CACHE_COLUMNS)
PROVENANCE_COLUMNS = tuple(
    Column(c, c.removesuffix("_tokens").replace("_", " ")) for c in records.PROVENANCE_COLUMNS
)
PAIR_COLUMNS = (
    Column("kind", "kind", "text"),
    Column("from_agent", "from", "text"),
    Column("to_agent", "to", "text"),
    *CACHE_COLUMNS,
    Column("miss_share", "miss share", "ratio"),
    Column("miss_calls", "calls with 0 cached"),
    Column("shared_prefix_tokens", "shared prefix"),
    Column("unserved_shared_prefix_tokens", "shared prefix recomputed"),
    Column("gap_ms_p50", "gap p50 ms", "ms"),
    Column("provenance_calls", "calls with provenance"),
    *PROVENANCE_COLUMNS,
)
SHORT_COMPONENTS = {  # latency.COMPONENTS, in a table header's few words
    "queue_ms": "queue",
    "prefill_ms": "prefill",
    "ttft_unsplit_ms": "TTFT not split",
    "decode_ms": "decode",
    "call_other_ms": "call overhead",
    "failed_ms": "failed calls",
    "tool_ms": "tool",
    "other_ms": "other/ client",
}
COMPONENT_COLUMNS = tuple(Column(c, SHORT_COMPONENTS[c], "ms") for c in latency.COMPONENTS)
LATENCY_COLUMNS = (
    Column("agent_id", "agent", "text"),
    Column("calls", "calls"),
    *COMPONENT_COLUMNS,
    Column("path_ms", "total", "ms"),
    Column("share", "share of workflow time", "ratio"),
    Column("weighted_hit_ratio", "weighted hit", "ratio"),
    Column("cache_miss_ms", "cache-miss cost", "ms"),
    Column("flag", "flag", "text"),
)
WORKFLOW_COLUMNS = (
    Column("workflow_run_id", "workflow", "text"),
    Column("calls", "calls"),
    Column("failed", "failed"),
    *COMPONENT_COLUMNS,
    Column("path_ms", "critical path", "ms"),
    Column("wall_ms", "wall time", "ms"),
    Column("weighted_hit_ratio", "weighted hit", "ratio"),
    Column("slowest_agent", "slowest agent", "text"),
)
EVICTION_COLUMNS = (
    Column("evictor_agent_id", "evictor", "text"),
    Column("victim_agent_id", "victim", "text"),
    Column("evictions", "blocks evicted"),
    Column("same_workflow", "same workflow"),
    Column("harmful", "harmful"),
    Column("recomputed_tokens", "recomputed tokens"),
    Column("residency_ms_p50", "residency p50 ms", "ms"),
)
RUNS_COLUMNS = (
    Column("run", "run", "text"),
    Column("agent_id", "agent", "text"),
    *CACHE_COLUMNS,
    Column("cached_cross_agent_tokens", "cross-agent cached"),
    Column("first_divergence_previous_agent_mean", "first divergence vs previous (mean)"),
    Column("max_reusable_tokens_mean", "max reusable (mean)"),
)
