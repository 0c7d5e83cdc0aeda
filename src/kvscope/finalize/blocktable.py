"""The block table (records.blocks, one row per block life) built column by column.

`block_table(lives, by_uuid)` gives the pyarrow table finalize writes as blocks.parquet: the same
rows, in ledger order, that one records.blocks.BlockRecord per life would give. The lives come
as columns (`LifeColumns`: numpy arrays for the numbers, lists of shared strings for the
requests), the numeric columns go to Arrow without a Python object per value, and each string
column is made a list, converted and freed before the next one is built, so the peak is one
column of references, not a dict or an object per block life.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from kvscope.records.agents import transition_label
from kvscope.records.base import Row
from kvscope.records.blocks import BLOCKS_SCHEMA

REMOVALS = (None, "evicted", "cleared")  # LifeColumns.removal codes 0, 1, 2
STILL_CACHED, EVICTED, CLEARED = range(3)


@dataclass(frozen=True)
class LifeColumns:
    """Block lives in ledger order, one entry per life in every column."""

    block_hash: np.ndarray  # int64
    tokens: np.ndarray  # int64
    stored_ns: np.ndarray  # int64
    removed_ns: np.ndarray  # int64; meaningless where removal is STILL_CACHED
    removal: np.ndarray  # int8: a code of REMOVALS
    owner: list[str | None]  # request_uuid
    attribution: list[str | None]  # "session_id" | "tokens"
    hits: np.ndarray  # int64: requests served by this life
    evictor: list[str | None]
    evictor_method: list[str | None]  # how it was inferred
    needed_by: list[str | None]  # the first request that recomputed it after it was removed
    needed: np.ndarray  # int64: how many requests did


def block_table(
    lives: LifeColumns, by_uuid: Mapping[str, Row], replica: str | None = None
) -> pa.Table:
    """The lives' block table, with records.blocks.BLOCKS_SCHEMA (`replica`: whose cache)."""
    n = len(lives.block_hash)
    kept = lives.removal == STILL_CACHED  # no removal time: null
    harmful = (lives.removal == EVICTED) & (lives.needed > 0)
    owner: list[Row | None] = [by_uuid.get(u or "") for u in lives.owner]
    evictor: list[Row | None] = [by_uuid.get(u or "") for u in lives.evictor]
    needer = [by_uuid.get(u) if u else None for u in lives.needed_by]
    columns: dict[str, Callable[[], Any]] = {
        "block_hash": lambda: lives.block_hash,
        "tokens": lambda: lives.tokens,
        "stored_ns": lambda: lives.stored_ns,
        "removed_ns": lambda: pa.array(lives.removed_ns, mask=kept),
        "removal": lambda: [REMOVALS[c] for c in lives.removal.tolist()],
        "residency_ms": lambda: pa.array((lives.removed_ns - lives.stored_ns) / 1e6, mask=kept),
        "owner_request_uuid": lambda: lives.owner,
        "owner_agent_id": lambda: _field(owner, "agent_id"),
        "owner_workflow_run_id": lambda: _field(owner, "workflow_run_id"),
        "owner_turn_id": lambda: _field(owner, "turn_id"),
        "attribution": lambda: lives.attribution,
        "hits": lambda: lives.hits,
        "evictor_request_uuid": lambda: lives.evictor,
        "evictor_agent_id": lambda: _field(evictor, "agent_id"),
        "evictor_workflow_run_id": lambda: _field(evictor, "workflow_run_id"),
        "evictor_inferred": lambda: lives.evictor_method,
        "harmful": lambda: harmful,
        "recomputed_tokens": lambda: np.where(harmful, lives.tokens * lives.needed, 0),
        "needed_by_request_uuid": lambda: _field(needer, "request_uuid"),
        "needed_by_agent_id": lambda: _field(needer, "agent_id"),
        "needed_by_transition": lambda: _transitions(needer),
        "replica": lambda: [replica] * n,
    }
    assert list(columns) == BLOCKS_SCHEMA.names
    arrays = [_arrow(columns[f.name](), f.type) for f in BLOCKS_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=BLOCKS_SCHEMA)


def _arrow(values: Any, kind: pa.DataType) -> pa.Array:
    if isinstance(values, pa.Array):
        return values.cast(kind)
    return pa.array(values, type=kind)


def _field(rows: list[Row | None], name: str) -> list[Any]:
    return [r[name] if r else None for r in rows]


def _transitions(rows: list[Row | None]) -> list[str | None]:
    """Each row's transition label, one string per distinct (previous agent, agent)."""
    labels: dict[tuple[str | None, str], str] = {}
    out: list[str | None] = []
    for r in rows:
        if not r:
            out.append(None)
            continue
        pair = (r.get("previous_agent_id"), r["agent_id"])
        if pair not in labels:
            labels[pair] = transition_label(*pair)
        out.append(labels[pair])
    return out
