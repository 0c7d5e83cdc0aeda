"""kvscope's request-metrics export reader on lines SGLang 0.5.23's own exporter writes.

produce_with_sglang.py runs each request's clock through SchedulerReqTimeStats /
APIServerReqTimeStats and writes it with RequestMetricsExporterManager.write_record (the code
behind --export-metrics-to-file), into the folder SGLang parsed from kvscope's flags.
kvscope must join every line by the rid it sent and give back the queue / prefill / decode
times that were fed. Opt-in (`-m sglang`, scripts/test-sglang.sh).
"""

import json
import uuid

import pytest
from sglang_producer import FinishedRequest, SglangProducer

from kvscope.engines.sglang import SglangEngine, export_line_timings

pytestmark = pytest.mark.sglang

# Epoch-second timestamps (~1.8e9) in a float64: each difference is exact to ~0.25 µs.
MS_TOLERANCE = 1e-3


def test_export_goes_where_kvscope_reads(sglang: SglangProducer, engine: SglangEngine) -> None:
    assert sglang.info["export_dir"] == str(engine.output_dir / "request_metrics")


def test_exported_timings_join_by_rid(sglang: SglangProducer, engine: SglangEngine) -> None:
    reqs = [
        FinishedRequest(
            rid=f"req-{uuid.uuid4()}",
            agent=agent,
            prompt_tokens=900 + 100 * i,
            device_hit=64 * i,
            queue_s=queue,
            prefill_s=prefill,
            decode_s=decode,
            stream=i % 2 == 1,
        )
        for i, (agent, queue, prefill, decode) in enumerate(
            [
                ("planner", 0.25, 0.04, 0.6),
                ("executor", 0.0, 0.015, 0.35),  # admitted at once: 0 ms, not unknown
                ("expresser", 0.8125, 0.11, 1.9),
                ("reviewer", 0.003, 0.0625, 0.04),
            ]
        )
    ]
    for r in reqs:
        r.send(sglang, engine)

    timings = engine.exported_timings()
    for r in reqs:
        assert timings[r.rid] == pytest.approx(
            {"queue_ms": r.queue_s * 1000, "prefill_ms": r.prefill_s * 1000,
             "decode_ms": r.decode_s * 1000},
            abs=MS_TOLERANCE,
        ), r.agent  # fmt: skip


def test_every_exported_line_is_joined(sglang: SglangProducer, engine: SglangEngine) -> None:
    r = FinishedRequest(rid=f"req-{uuid.uuid4()}", agent="planner", prompt_tokens=512)
    r.send(sglang, engine)
    body, _ = engine.request_tags(r.rid, r.agent)
    folder = engine.output_dir / "request_metrics"
    files = sorted(folder.glob("sglang-request-metrics-*.log"))
    assert files, f"SGLang wrote no export file kvscope would find in {folder}"
    lines = [ln for f in files for ln in f.read_text().splitlines() if ln.strip()]

    rids = []
    for line in lines:
        rid, timings = export_line_timings(line)
        assert rid is not None and set(timings) == {"queue_ms", "prefill_ms", "decode_ms"}
        rids.append(rid)
    assert len(set(rids)) == len(lines)  # one line per request, each with its own rid
    assert set(engine.exported_timings()) == set(rids)
    # kvscope's tags reached SGLang's record: the rid joins, the session and agent ride along
    (line,) = [ln for ln, rid in zip(lines, rids, strict=True) if rid == r.rid]
    params = json.loads(json.loads(line)["request_parameters"])
    assert {k: params[k] for k in body} == body
    assert params["custom_labels"] == {"agent": r.agent}
