"""The payload stream (payloads.jsonl): what each call sent and got back, for its trace span.

Written only while traces are on (tracking.traces): the MLflow LLM span of a call shows its
request (messages or prompt, model, parameters) as inputs and the reply text as output.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.records.base import read_jsonl, record_dict

PAYLOADS_JSONL = "payloads.jsonl"


@dataclass(frozen=True)
class CallPayload:
    request_uuid: str
    inputs: dict[str, Any]  # the request body the app sent (kvscope's tags left out)
    output: str | None  # the reply's text; None when the call failed

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


def load_payloads(run_dir: Path) -> dict[str, CallPayload]:
    """request_uuid -> its payload; empty when the run has no stream."""
    path = run_dir / PAYLOADS_JSONL
    rows = read_jsonl(path)[0] if path.exists() else []
    return {r["request_uuid"]: CallPayload(**r) for r in rows}
