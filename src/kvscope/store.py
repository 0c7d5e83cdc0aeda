"""One directory per run: an append-only JSONL while running, Parquet at the end.

Every row is written and flushed the moment its call ends, so a crash loses nothing that was
measured; `kvscope convert RUN_DIR` turns a crashed run's streams into its tables (finalize).
"""

import json
import secrets
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvscope.schema import ARROW_SCHEMA, COLUMNS, RequestRecord

REQUESTS_JSONL = "requests.jsonl"
REQUESTS_PARQUET = "requests.parquet"
RUN_JSON = "run.json"


def new_run(runs_dir: Path, name: str) -> tuple[str, Path]:
    """A fresh benchmark_run_id and its directory."""
    run_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    path = runs_dir / run_id
    path.mkdir(parents=True, exist_ok=False)
    return run_id, path


class RequestLog:
    """Appends one JSON line per record and flushes it at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        self.rows = 0

    def append(self, record: RequestRecord) -> None:
        self._file.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")
        self._file.flush()
        self.rows += 1

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Rows of a request JSONL, and how many unreadable lines (a torn last write) were skipped."""
    rows, bad = [], 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1
    return rows, bad


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    columns = {name: [row.get(name) for row in rows] for name in COLUMNS}
    return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)


def write_requests(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    target = run_dir / REQUESTS_PARQUET
    pq.write_table(to_table(rows), target)
    return target


def load_requests(run_dir: Path) -> pa.Table:
    """The run's request table: Parquet when written, else straight from the JSONL."""
    parquet = run_dir / REQUESTS_PARQUET
    if parquet.exists():
        return pq.read_table(parquet)
    return to_table(read_jsonl(run_dir / REQUESTS_JSONL)[0])
