"""The block table (blocks.parquet): one row per block life in the engine's KV cache, built by
finalize from the KV events and the request rows (kvscope.analysis.provenance)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvscope.records.base import arrow_schema, conform, record_dict

BLOCKS_PARQUET = "blocks.parquet"


@dataclass(frozen=True)
class BlockRecord:
    block_hash: int
    tokens: int | None
    stored_ns: int | None
    removed_ns: int | None
    removal: str | None  # evicted | cleared | null (still cached at the end)
    residency_ms: float | None
    owner_request_uuid: str | None
    owner_agent_id: str | None
    owner_workflow_run_id: str | None
    owner_turn_id: int | None
    attribution: str | None  # session_id | tokens | null
    hits: int | None  # later requests served by this block
    evictor_request_uuid: str | None
    evictor_agent_id: str | None
    evictor_workflow_run_id: str | None
    evictor_inferred: str | None  # how: same-step store | in flight
    harmful: bool | None
    recomputed_tokens: int | None
    needed_by_request_uuid: str | None
    needed_by_agent_id: str | None
    needed_by_transition: str | None
    replica: str | None = None  # the replica whose cache held it (a deployment); None: one engine

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


BLOCKS_SCHEMA = arrow_schema(BlockRecord, {"tokens": pa.int32()})


def load_table(run_dir: Path) -> pa.Table | None:
    """blocks.parquet with every column (an older table's missing ones null); None: no table."""
    path = run_dir / BLOCKS_PARQUET
    return conform(pq.read_table(path), BLOCKS_SCHEMA) if path.exists() else None
