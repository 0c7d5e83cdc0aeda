"""finalize.json: what finalize read from the streams and matched, for the analysis to report."""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.records.base import record_dict

FINALIZE_JSON = "finalize.json"


@dataclass(frozen=True)
class KvReport:
    batches: int
    events: int
    missing_batches: int  # sequence numbers never received, live or by replay
    recovered_batches: int  # received only through the replay socket
    orphan_blocks: int  # stored on a parent never seen: cannot be matched to prompts
    skipped: dict[str, int] = field(default_factory=dict)  # requests without provenance, why
    queue_unknown: int = 0  # requests with provenance placed at their send time (no queue time)
    # the listener's own summary (gaps with times); a deployment's: one per replica, by name
    listener: dict[str, Any] | None = None


@dataclass(frozen=True)
class Finalized:
    rows: int  # request rows read
    skipped_lines: int  # unreadable JSONL lines (a write cut short)
    context_rows: int  # rows with /metrics context
    blocks: int  # block lives in blocks.parquet
    kv: KvReport | None  # None: no KV events were recorded

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    def write(self, run_dir: Path) -> None:
        (run_dir / FINALIZE_JSON).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> "Finalized | None":
        path = run_dir / FINALIZE_JSON
        if not path.exists():
            return None
        d = json.loads(path.read_text())
        kv = KvReport(**d["kv"]) if d.get("kv") else None
        return cls(**(d | {"kv": kv}))
