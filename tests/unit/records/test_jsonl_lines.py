"""JsonlWriter's lines: orjson from the record's fields, the same values as json over to_dict."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.records.base import JsonlWriter, read_jsonl, record_dict
from kvscope.records.payloads import CallPayload
from kvscope.records.requests import RequestRecord, to_table


@dataclass(frozen=True)
class Wide:
    key: str
    value: Any

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


def test_lines_read_back_as_the_records_dicts(tmp_path: Path) -> None:
    payload = CallPayload("u1", {"messages": [{"role": "user", "content": "héllo ✓"}],
                                 "stop": ("a", "b"), "n": {1: "one"}}, "répondu")  # fmt: skip
    wide = Wide("big", 2**70)  # wider than orjson's 64 bits: json writes it
    with JsonlWriter[Any](tmp_path / "s.jsonl") as writer:
        writer.append(payload)
        writer.append(wide)
    rows, bad = read_jsonl(tmp_path / "s.jsonl")
    assert bad == 0
    assert rows == [json.loads(json.dumps(payload.to_dict())), {"key": "big", "value": 2**70}]
    assert "héllo ✓".encode() in (tmp_path / "s.jsonl").read_bytes()  # UTF-8, not \\u escapes


def test_a_request_row_round_trips_to_the_typed_table(tmp_path: Path) -> None:
    fields = {f: None for f in RequestRecord.__dataclass_fields__}
    values = {"request_uuid": "u", "status": "ok", "prompt_tokens": 12,
              "reported_cache_hit_ratio": 0.25, "agent_id": "plännër"}  # fmt: skip
    record = RequestRecord(**fields | values)
    with JsonlWriter[RequestRecord](tmp_path / "r.jsonl") as writer:
        writer.append(record)
    (row,) = read_jsonl(tmp_path / "r.jsonl")[0]
    assert row == record.to_dict()
    assert to_table([row]).to_pylist() == to_table([record.to_dict()]).to_pylist()
