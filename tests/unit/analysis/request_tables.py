"""Hand-made request tables for the analysis tests (tests/unit/analysis, report)."""

from typing import Any

import pyarrow as pa

from kvscope.records.requests import ARROW_SCHEMA, COLUMNS, to_table

MS = 1_000_000  # ns per ms


def request(**values: Any) -> dict[str, Any]:
    """A full request row: identity defaults, every measurement null unless given."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(
        benchmark_run_id="run-1",
        experiment_name="exp",
        configuration_hash="abc",
        timestamp="2026-01-01T00:00:00+00:00",
        thread_id="t0",
        workflow_run_id="w0",
        workflow_type="peer",
        workflow_concurrency=1,
        turn_id=1,
        agent_id="planner",
        graph_node="planner",
        model_name="m",
        status="ok",
        start_ns=0,
        end_ns=0,
    )
    row.update(values)
    row["graph_node"] = row["agent_id"]
    row.setdefault("request_uuid", None)
    if row["request_uuid"] is None:
        row["request_uuid"] = f"{row['workflow_run_id']}-{row['agent_id']}-{row['start_ns']}"
    return row


def table(*rows: dict[str, Any]) -> pa.Table:
    return to_table(list(rows))


def test_request_rows_fit_the_canonical_schema() -> None:
    t = table(request(prompt_tokens=10), request(agent_id="executor", start_ns=5))
    assert t.schema == ARROW_SCHEMA
    assert t["cached_tokens"].null_count == 2
    assert t["request_uuid"].to_pylist() == ["w0-planner-0", "w0-executor-5"]
