"""SGLang's per-request timing from its own request-metrics export file, joined by rid."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import SGLANG_FIXTURES

from kvscope.config import EngineConfig
from kvscope.engines.sglang import SglangEngine, export_line_timings

EXPORT = SGLANG_FIXTURES / "request_metrics_export.log"


@pytest.fixture
def engine(tmp_path: Path) -> SglangEngine:
    folder = tmp_path / "request_metrics"
    folder.mkdir()
    shutil.copy(EXPORT, folder / "sglang-request-metrics-20261121_09.log")
    with (folder / "sglang-request-metrics-20261121_10.log").open("w") as f:
        f.write("{not json\n\n")  # a torn line is skipped, not fatal
    return SglangEngine(EngineConfig(kind="sglang", output_dir=tmp_path))


def test_every_workload_request_is_joined_by_rid(engine: SglangEngine) -> None:
    timings = engine.exported_timings()
    index = json.loads((SGLANG_FIXTURES / "requests_index.json").read_text())
    workload = {r["rid"] for r in index["requests"] if r["phase"] == "workload"}
    assert set(timings) == workload  # the 24 workload requests, each by the rid kvscope sent
    assert len(timings) == 24


def test_values_follow_the_export_fields(engine: SglangEngine) -> None:
    timings = engine.exported_timings()
    for line in EXPORT.read_text().splitlines():
        rec = json.loads(line)
        rid = json.loads(rec["request_parameters"])["rid"]
        t = timings[rid]
        assert t["queue_ms"] == pytest.approx(rec["queue_time"] * 1000)
        prefill = (rec["prefill_finished_time"] - rec["forward_entry_time"]) * 1000
        decode = (rec["request_finished_ts"] - rec["prefill_finished_time"]) * 1000
        assert t["prefill_ms"] == pytest.approx(prefill)
        assert t["decode_ms"] == pytest.approx(decode)
        assert t["prefill_ms"] > 0 and t["decode_ms"] > 0
        # server e2e covers the parts (queue + prefill + decode <= e2e, up to clock rounding)
        assert t["queue_ms"] + t["prefill_ms"] + t["decode_ms"] <= rec["e2e_latency"] * 1000 + 1


def test_missing_fields_are_null_not_zero() -> None:
    line = json.dumps({"request_parameters": json.dumps({"rid": "req-1"}), "queue_time": None})
    rid, t = export_line_timings(line)
    assert rid == "req-1"
    assert t == {"queue_ms": None, "prefill_ms": None, "decode_ms": None}
    assert export_line_timings("garbage") == (None, {})
