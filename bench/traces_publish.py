"""Writing a run's MLflow traces at publish: the fluent writer vs the bulk one. Prints numbers.

    .venv/bin/python bench/traces_publish.py [--traces 2000 20000] [--writers fluent api bulk]

A synthetic run of T graph invocations as bench/load.py's app makes them (4 agents, planner ->
executor -> expresser -> reviewer, one call each; the executor runs one tool; every 50th
invocation has a failed call), with the columns a real row has filled (bench/finalize_run.py's
`filled`) and a payload per call of a real one's size (a ~700-character system prompt, a user
message, the reply), is written by each writer into a fresh local SQLite store
(`sqlite:///<tmp>/mlflow.db`, kvscope's default) under a started MLflow run, as publish does:
`kvscope.traces.write_traces`, then `TrackingRun.finish` (drain MLflow's queues, the audit that
counts every trace's spans: one SQL query on this store, end the run). Writers: `fluent` (one
span at a time through MLflow's fluent API, as before the bulk writer), `api` (built in bulk,
written through MLflow's store API: `log_spans` per 100 traces, `start_trace` per trace, as the
bulk writer writes to a tracking server) and `bulk` (kvscope's default: rows inserted, one
transaction per 500 traces). Printed: the machine (CPU, cores, load average: it may be shared),
then per writer and size: seconds to write, seconds to finish (flush, audit, end the run),
traces/s over both, traces audited as written of expected, the ratio to the first writer, and
both times scaled to a 100k-call run. The traces are 10 spans each (root, 4 agent visits, 4 LLM
calls, 1 tool); a 100k-call run of such invocations is 25,000 traces. The fluent and api writers
(~50 ms a trace) run only up to --fluent-up-to.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from finalize_run import CONSTANT, filled

from kvscope import trace_writer
from kvscope.config import TrackingConfig
from kvscope.probe.tracing import TraceAudit, TrackingRun
from kvscope.records import requests
from kvscope.records.payloads import PAYLOADS_JSONL, CallPayload
from kvscope.records.tools import TOOLS_JSONL, ToolCall
from kvscope.traces import write_traces

AGENTS = ("planner", "executor", "expresser", "reviewer")
SYSTEM = {a: f"You are the {a} of a finance desk. " + "Keep the books. " * 40 for a in AGENTS}
MS = 1_000_000
CALLS_PER_TRACE = len(AGENTS)
HUNDRED_K = 100_000 // CALLS_PER_TRACE  # traces of a 100k-call run


def synthetic(traces: int) -> tuple[pa.Table, list[ToolCall], list[CallPayload]]:
    """The finalized table, tool runs and payloads of `traces` invocations, 4 calls each."""
    rows, tools, payloads = [], [], []
    empty = dict.fromkeys(requests.COLUMNS)
    for w in range(traces):
        t0 = 1_700_000_000_000 * MS + w * 40 * MS
        for i, agent in enumerate(AGENTS):
            n = w * CALLS_PER_TRACE + i
            uuid, start = f"w{w}-{agent}", t0 + i * 10 * MS
            r: dict[str, Any] = {
                "request_uuid": uuid, "workflow_run_id": f"w{w}", "agent_id": agent,
                "turn_id": 1, "previous_agent_id": AGENTS[i - 1] if i else None,
                "start_ns": start, "end_ns": start + 9 * MS, "status": "ok",
                "prompt_tokens": 592, "cached_tokens": 448 if i else 0,
            }  # fmt: skip
            r = empty | CONSTANT | r | filled(r, n) | {"thread_id": f"load-{w % 100}"}
            if w % 50 == 49 and agent == "reviewer":
                r |= {"status": "error", "error_type": "HTTPStatusError",
                      "error_message": "engine returned 500", "finish_reason": None}  # fmt: skip
            rows.append(r)
            user = f"Turn 1 of workflow {w}: what next?"
            messages = [{"role": "system", "content": SYSTEM[agent]},
                        {"role": "user", "content": user}]  # fmt: skip
            body = {"model": "smollm2", "messages": messages, "max_tokens": 8, "stream": True}
            reply = None if r["status"] != "ok" else f"The {agent} says: books kept."
            payloads.append(CallPayload(uuid, body, reply))
            if agent == "executor":
                tools.append(ToolCall("lookup", f"w{w}", agent, start + 2 * MS, start + 4 * MS,
                                      None, f"account {w}", "balance 100"))  # fmt: skip
    return requests.to_table(rows), tools, payloads


def write_run_dir(folder: Path, tools: list[ToolCall], payloads: list[CallPayload]) -> None:
    with (folder / TOOLS_JSONL).open("w") as f:
        f.writelines(json.dumps(t.to_dict()) + "\n" for t in tools)
    with (folder / PAYLOADS_JSONL).open("w") as f:
        f.writelines(json.dumps(p.to_dict()) + "\n" for p in payloads)


def one(
    writer: str, table: pa.Table, run_dir: Path, store: Path
) -> tuple[float, float, TraceAudit]:
    """Write the run's traces with `writer` into a fresh store: (write s, finish s, audit)."""
    store.mkdir()
    run = TrackingRun.open(TrackingConfig(experiment="bench-traces"), store)
    run.start(writer, {}, {})
    chosen = trace_writer.bulk_path
    if writer == "api":  # the bulk writer as it writes to a tracking server, on this store
        trace_writer.bulk_path = lambda *_: trace_writer.CLIENT  # type: ignore[assignment]
    t = time.perf_counter()
    try:
        done = write_traces(
            run_dir, table, client=run.client, experiment_id=run.experiment_id,
            run_id=run.run_id or "", bulk=writer != "fluent",
        )  # fmt: skip
    finally:
        trace_writer.bulk_path = chosen
    write = time.perf_counter() - t
    t = time.perf_counter()
    audit = run.finish(done.expected)
    return write, time.perf_counter() - t, audit


def machine() -> str:
    """The CPU model and cores, and the load average at the start (a shared machine)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "?")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, load average {load}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=int, nargs="+", default=[2000, 20000])
    p.add_argument("--writers", nargs="+", default=["fluent", "bulk"],
                   choices=["fluent", "api", "bulk"])  # fmt: skip
    p.add_argument(
        "--fluent-up-to",
        type=int,
        default=2000,
        help="run the fluent and api writers only up to this many traces (~50 ms a trace)",
    )
    a = p.parse_args()
    print(machine(), flush=True)
    for n in a.traces:
        table, tools, payloads = synthetic(n)
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            run_dir.mkdir()
            write_run_dir(run_dir, tools, payloads)
            rates: dict[str, float] = {}
            for writer in a.writers:
                if writer != "bulk" and n > a.fluent_up_to:
                    print(f"{n:,} traces, {writer}: skipped (over --fluent-up-to)", flush=True)
                    continue
                write, finish, audit = one(writer, table, run_dir, Path(tmp) / writer)
                rates[writer] = rate = n / (write + finish)
                ratio = "" if writer == a.writers[0] or a.writers[0] not in rates else (
                    f", {rate / rates[a.writers[0]]:.1f}x {a.writers[0]}")  # fmt: skip
                print(
                    f"{n:,} traces ({n * CALLS_PER_TRACE:,} calls), {writer}: write {write:.1f} s"
                    f" ({n / write:,.0f} traces/s) + finish (flush, audit, end) {finish:.1f} s"
                    f" = {write + finish:.1f} s, {rate:,.0f} traces/s{ratio}; audited"
                    f" {audit.written:,} written of {audit.expected:,} ({audit.dropped} dropped);"
                    f" a 100k-call run ({HUNDRED_K:,} traces) at this rate: write"
                    f" {HUNDRED_K / n * write:.0f} s + finish {HUNDRED_K / n * finish:.0f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
