"""The prompt-columns stream: a call's tokenizer-made prompt columns, written after its row.

A call whose prompt ids kvscope makes with the model's tokenizer (no ids from the engine) has
them made off the app's thread (probe/background.py, probe/tokenizer_process.py): its row is
written without them, and one PromptColumns record per call follows in
prompt_columns.jsonl (parts `.<pid>` merged on close like the other call streams).
`with_prompt_columns` puts them into the request table by request_uuid; finalize and
`load_table` read the table that way. A call whose record never came (the program was killed
before the tokenizer caught up) keeps null prompt columns: not measured.
"""

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kvscope.records.base import read_jsonl, record_dict

PROMPT_COLUMNS_JSONL = "prompt_columns.jsonl"
# where a record's tokenization ran: the tokenizer process (probe/tokenizer_process.py), the
# tokenizer thread of the app's process, the app's own thread (the thread's queue was full)
PROCESS, WORKER, APP = "process", "worker", "app"


@dataclass(frozen=True)
class PromptColumns:
    """A call's prompt columns (records.requests.RequestRecord's of the same names)."""

    request_uuid: str
    prompt_token_source: str | None = None
    prompt_token_count: int | None = None
    prompt_token_mismatch: bool | None = None
    prompt_hash: str | None = None
    token_id_hash: str | None = None
    fixed_prefix_tokens: int | None = None
    dynamic_suffix_tokens: int | None = None
    serialized_prompt_text: str | None = None
    tokenized_on: str = WORKER  # APP: the tokenizer's queue was full, the app's thread did it

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


# the request table's columns this stream sets (every field but the key and the bookkeeping)
COLUMNS: tuple[str, ...] = tuple(
    f.name for f in fields(PromptColumns) if f.name not in ("request_uuid", "tokenized_on")
)


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The stream's records as dicts (empty without a stream); a call's last record wins."""
    path = run_dir / PROMPT_COLUMNS_JSONL
    return read_jsonl(path)[0] if path.exists() else []


def with_prompt_columns(table: pa.Table, run_dir: Path) -> pa.Table:
    """The request table with the stream's columns set on their calls' rows (row order kept; a
    value the row has already stays)."""
    records = read(run_dir)
    if not records or table.num_rows == 0:
        return table
    latest = {r["request_uuid"]: r for r in records}
    keys = pa.array(list(latest), pa.string())
    at = pc.index_in(table.column("request_uuid"), value_set=keys)
    for name in COLUMNS:
        index = table.schema.get_field_index(name)
        kind = table.schema.field(index).type
        values = pa.array([r.get(name) for r in latest.values()], kind)
        table = table.set_column(
            index, table.schema.field(index), pc.coalesce(table.column(index), values.take(at))
        )
    return table


def tokenized_on(run_dir: Path) -> dict[str, int]:
    """How many calls were tokenized where: {"process": n, "worker": m, "app": k} (empty
    without a stream)."""
    counts: dict[str, int] = {}
    for r in read(run_dir):
        where = str(r.get("tokenized_on") or WORKER)
        counts[where] = counts.get(where, 0) + 1
    return counts
