"""The block table (records.blocks, one row per block life) built column by column.

`block_table(lives, by_uuid)` gives the pyarrow table finalize writes as blocks.parquet: the same
rows, in ledger order, that one records.blocks.BlockRecord per life would give, but each column
is made a Python list, converted to Arrow and freed before the next one is built, so the peak is
one column of Python objects, not a dict per block life (about 1.2 kB each: 240 MB at 200k).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa

from kvscope.records.blocks import BLOCKS_SCHEMA
from kvscope.records.requests import transition_label

Row = Mapping[str, Any]


class Life(Protocol):
    """What the table reads of a block life (provenance.BlockLife)."""

    block_hash: int
    tokens: int
    stored_ns: int
    removed_ns: int | None
    removal: str | None
    owner: str | None
    attribution: str | None
    evictor: str | None
    evictor_method: str | None
    hits: int  # requests served by this life
    needed_by: str | None  # the first request that recomputed it after it was removed
    needed: int  # how many did


def block_table(
    lives: Sequence[Life], by_uuid: Mapping[str, Row], replica: str | None = None
) -> pa.Table:
    """The lives' block table, with records.blocks.BLOCKS_SCHEMA (`replica`: whose cache)."""
    owner = [by_uuid.get(b.owner or "") for b in lives]
    evictor = [by_uuid.get(b.evictor or "") for b in lives]
    needer = [by_uuid.get(b.needed_by) if b.needed_by else None for b in lives]
    harmful = [b.removal == "evicted" and b.needed > 0 for b in lives]
    columns: dict[str, Callable[[], list[Any]]] = {
        "block_hash": lambda: [b.block_hash for b in lives],
        "tokens": lambda: [b.tokens for b in lives],
        "stored_ns": lambda: [b.stored_ns for b in lives],
        "removed_ns": lambda: [b.removed_ns for b in lives],
        "removal": lambda: [b.removal for b in lives],
        "residency_ms": lambda: [
            None if b.removed_ns is None else (b.removed_ns - b.stored_ns) / 1e6 for b in lives
        ],
        "owner_request_uuid": lambda: [b.owner for b in lives],
        "owner_agent_id": lambda: _field(owner, "agent_id"),
        "owner_workflow_run_id": lambda: _field(owner, "workflow_run_id"),
        "owner_turn_id": lambda: _field(owner, "turn_id"),
        "attribution": lambda: [b.attribution for b in lives],
        "hits": lambda: [b.hits for b in lives],
        "evictor_request_uuid": lambda: [b.evictor for b in lives],
        "evictor_agent_id": lambda: _field(evictor, "agent_id"),
        "evictor_workflow_run_id": lambda: _field(evictor, "workflow_run_id"),
        "evictor_inferred": lambda: [b.evictor_method for b in lives],
        "harmful": lambda: harmful,
        "recomputed_tokens": lambda: [
            b.tokens * b.needed if h else 0 for b, h in zip(lives, harmful, strict=True)
        ],
        "needed_by_request_uuid": lambda: _field(needer, "request_uuid"),
        "needed_by_agent_id": lambda: _field(needer, "agent_id"),
        "needed_by_transition": lambda: _transitions(needer),
        "replica": lambda: [replica] * len(lives),
    }
    assert list(columns) == BLOCKS_SCHEMA.names
    arrays = [pa.array(columns[f.name](), type=f.type) for f in BLOCKS_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=BLOCKS_SCHEMA)


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
