"""What a run directory holds: one record type per stream, its Arrow schema and its file name.

Streams are appended while the run goes (JSONL, or an Arrow IPC stream for token ids; flushed per
record) and turned into tables by finalize: requests (requests.jsonl -> requests.parquet), prompt
tokens (prompt_tokens.arrow), /metrics samples (metrics.kvscope.jsonl, metrics.parquet +
metrics.gaps.json), KV events (kv_events.arrow -> kv_events.parquet, kv_events.summary.json) and
the block table
(blocks.parquet). Beside them, priorities.py: eviction hint levels, the one definition the probe
sends and the replay computes. This package imports nothing else of kvscope: every stage may
use it.
"""

import importlib
from typing import Any

# name -> its module: loaded on first use, so that importing one record module (a probe in an
# app's own interpreter: records/plain.py, tools.py, invocations.py) needs no pyarrow or orjson
_WHERE = {
    "ArrowWriter": "base", "JsonlWriter": "base", "read_jsonl": "base",
    "BLOCKS_PARQUET": "blocks", "BLOCKS_SCHEMA": "blocks", "BlockRecord": "blocks",
    "KV_EVENTS_ARROW": "kv_events", "KvBatch": "kv_events", "KvEvent": "kv_events",
    "ListenSummary": "kv_events", "METRICS_PARQUET": "metrics", "SCHEMA": "metrics",
    "MetricSample": "metrics", "ScrapeSummary": "metrics", "REQUESTS_JSONL": "requests",
    "REQUESTS_PARQUET": "requests", "RequestRecord": "requests", "TOKENS_ARROW": "tokens",
    "PromptTokenIds": "tokens",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'kvscope.records' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kvscope.records.{_WHERE[name]}"), name)


__all__ = [
    "BLOCKS_PARQUET",
    "BLOCKS_SCHEMA",
    "KV_EVENTS_ARROW",
    "METRICS_PARQUET",
    "REQUESTS_JSONL",
    "REQUESTS_PARQUET",
    "SCHEMA",
    "TOKENS_ARROW",
    "ArrowWriter",
    "BlockRecord",
    "JsonlWriter",
    "KvBatch",
    "KvEvent",
    "ListenSummary",
    "MetricSample",
    "PromptTokenIds",
    "RequestRecord",
    "ScrapeSummary",
    "read_jsonl",
]
