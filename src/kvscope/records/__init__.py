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

from kvscope.records.base import ArrowWriter, JsonlWriter, read_jsonl
from kvscope.records.blocks import BLOCKS_PARQUET, BLOCKS_SCHEMA, BlockRecord
from kvscope.records.kv_events import KV_EVENTS_ARROW, KvBatch, KvEvent, ListenSummary
from kvscope.records.metrics import METRICS_PARQUET, SCHEMA, MetricSample, ScrapeSummary
from kvscope.records.requests import REQUESTS_JSONL, REQUESTS_PARQUET, RequestRecord
from kvscope.records.tokens import TOKENS_ARROW, PromptTokenIds

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
