"""A whole finalize of a large run read from its files: wall time and peak memory. Prints numbers.

bench/provenance.py times the Level 3 passes on a run held in memory. This writes the same
synthetic run (W workflows x C cycles x 4 PEER agents, an LRU cache's KV events) as a run
directory holds it: requests.jsonl (rows filled as a real run's), prompt_tokens.arrow and
kv_events.arrow (written as a capture writes them, a record batch per call and per KV batch: the
time per call is printed; then rewritten in large batches, as a capture's close does) and
metrics.parquet (the /metrics scrapes the context columns come from). Then it runs
`kvscope.finalize.finalize` on that directory in a fresh child process, which reads the
streams, joins the /metrics series, runs divergence, the ledger and provenance, and writes
requests.parquet, kv_events.parquet and blocks.parquet. It prints the child's wall time and
peak RSS, and the size of what it read.

With --publish the run also has what a traced run keeps (payloads.jsonl: a request body of a
real call's size and the reply, per call; tools.jsonl: one tool run per invocation) and each
workflow's cycle is a graph invocation of its own (4 calls, 1 tool: a 10-span trace, as
bench/traces_publish.py's), and the child goes on as `kvscope run` concludes a run
(pipeline.py): the analysis, summary.json and the figures, report.html, then the MLflow run in
a fresh local SQLite store under the run directory's parent (params, metrics, artifacts, every
trace, the trace audit, the run ended). It prints the seconds of each stage, what the audit
found against the rows (a trace per invocation, nothing lost) and the child's peak RSS.

    .venv/bin/python bench/finalize_run.py --workflows 8334 --cycles 3   # 100k requests
    .venv/bin/python bench/finalize_run.py --workflows 8334 --cycles 3 --vocab 100000  # 4-byte ids
    .venv/bin/python bench/finalize_run.py --workflows 8334 --cycles 3 --publish  # + publish
    .venv/bin/python bench/finalize_run.py ... --publish --traces-before-analysis
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from provenance import AGENTS, synthetic

from kvscope.probe.streams import merge_parts, token_writer
from kvscope.records import metrics, requests
from kvscope.records.base import ArrowWriter, compact
from kvscope.records.kv_events import BATCHES_SCHEMA, KV_EVENTS_ARROW, KvBatch
from kvscope.records.payloads import PAYLOADS_JSONL, CallPayload
from kvscope.records.tokens import TOKENS_ARROW, PromptTokenIds
from kvscope.records.tools import TOOLS_JSONL, ToolCall

CHILD = """
import sys, time
from pathlib import Path
from kvscope.finalize import finalize
t = time.perf_counter()
done = finalize(Path(sys.argv[1]))
wall = time.perf_counter() - t
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM"))
print(f"{wall:.2f} {done.rows} {done.blocks} {hwm / 1024:.0f}")
"""
PUBLISH_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from publish_stages import publish_run
publish_run(sys.argv[2], early=sys.argv[3:] == ["early"])
"""
SYSTEM = "You are the {} of a finance desk. " + "Keep the books. " * 40  # a ~700-char prompt
ENGINE_SAMPLES = 125
CONSTANT = {
    "benchmark_run_id": "bench-20261125-000000-a1b2c3", "experiment_name": "bench",
    "configuration_hash": "08b50e553b49", "workflow_type": "peer", "model_name": "smollm2",
}  # fmt: skip


def filled(r: dict[str, Any], n: int) -> dict[str, Any]:
    """The columns a real run's row has filled besides the synthetic ones (37 of a recorded
    vLLM run's row were set), with values of a real row's sizes: 16-hex hashes, a response id,
    floats; each row's own where a real run's are."""
    out = r["prompt_tokens"] - r["cached_tokens"]
    return {
        "thread_id": f"bench-t{n // 12:06d}", "graph_node": r["agent_id"],
        "timestamp": f"2026-11-25T{n // 3_600_000 % 24:02d}:{n // 60_000 % 60:02d}:"
                     f"{n // 1000 % 60:02d}.{n % 1000:03d}123+00:00",
        "workflow_concurrency": 8, "sglang_response_id": f"chatcmpl-{r['request_uuid']}-{n:08x}",
        "output_tokens": 48, "new_prefill_tokens": out,
        "reported_cache_hit_ratio": r["cached_tokens"] / r["prompt_tokens"],
        "ttft_ms": 600.0 + n % 977, "tpot_ms": 30.0 + n % 13 / 7, "prefill_ms": 500.0 + n % 911,
        "decode_ms": 1400.0 + n % 101, "e2e_ms": 2100.0 + n % 1999,
        "prompt_template_version": "peer-fqa-v1", "chat_template_name": "sha256:872be49dbb63",
        "prompt_hash": f"{n * 0x9E3779B1 & 0xFFFFFFFFFFFFFFFF:016x}",
        "token_id_hash": f"{n * 0x85EBCA77 & 0xFFFFFFFFFFFFFFFF:016x}",
        "prompt_layout": "shared-first", "sharing_mode": "documents",
        "fixed_prefix_tokens": 112, "dynamic_suffix_tokens": r["prompt_tokens"] - 112,
        "finish_reason": "length",
    }  # fmt: skip


def line(row: dict[str, Any]) -> str:
    """One JSONL line as kvscope's streams write it (records.base.JsonlWriter: compact)."""
    return json.dumps(row, separators=(",", ":")) + "\n"


def write_metrics(folder: Path, scrapes: int, end_ns: int) -> None:
    """metrics.parquet as a run writes it: `scrapes` scrapes over [0, end_ns], each with
    kvscope's instant values and ENGINE_SAMPLES engine samples (a recorded vLLM run's scrape had
    135 rows in all)."""
    names = ("kv_used_tokens", "kv_capacity_tokens", "kv_usage", "running_requests",
             "queued_requests", "prompt_tokens_total", "cached_tokens_total",
             "generation_tokens_total", "requests_total", "preemptions_total")  # fmt: skip
    per = len(names) + ENGINE_SAMPLES
    ts = np.repeat(np.linspace(0, end_ns, scrapes).astype(np.int64), per)
    rng = np.random.default_rng(1)
    metric = [f"kvscope:{n}" for n in names] + [f"vllm:sample_{k}" for k in range(ENGINE_SAMPLES)]
    kvscope = [*names, *[None] * ENGINE_SAMPLES]
    labels = ["{}"] * len(names) + ['{"engine": "0", "model_name": "smollm2"}'] * ENGINE_SAMPLES
    table = pa.table({
        "timestamp_ns": ts, "benchmark_run_id": [CONSTANT["benchmark_run_id"]] * len(ts),
        "metric_name": metric * scrapes, "labels": labels * scrapes,
        "value": rng.random(len(ts)) * 20_000, "kvscope_name": kvscope * scrapes,
    }, schema=metrics.SCHEMA)  # fmt: skip
    pq.write_table(table, folder / metrics.METRICS_PARQUET)


def write_traced(folder: Path, rows: list[dict[str, Any]]) -> None:
    """payloads.jsonl (a call's request body and reply) and tools.jsonl (a tool run inside each
    invocation's second call) as a traced run's capture writes them; each row made a call of
    the invocation of its workflow's cycle (its uuid without the agent)."""
    with (folder / PAYLOADS_JSONL).open("w") as payloads, (folder / TOOLS_JSONL).open("w") as tools:
        for r in rows:
            r["workflow_run_id"] = r["request_uuid"].rsplit("-", 1)[0]
            user = f"Turn {r['turn_id']} of {r['workflow_run_id']}: what next?"
            body = {"model": "smollm2", "max_tokens": 48, "stream": True, "messages": [
                {"role": "system", "content": SYSTEM.format(r["agent_id"])},
                {"role": "user", "content": user}]}  # fmt: skip
            reply = f"The {r['agent_id']} says: books kept."
            payloads.write(line(CallPayload(r["request_uuid"], body, reply).to_dict()))
            if r["previous_agent_id"] == AGENTS[0]:
                tool = ToolCall("lookup", r["workflow_run_id"], r["agent_id"], r["start_ns"] + 2,
                                r["start_ns"] + 4, None, "account 1", "balance 100")  # fmt: skip
                tools.write(line(tool.to_dict()))


def write_run(
    folder: Path, workflows: int, cycles: int, capacity_blocks: int, scrapes: int, vocab: int,
    traced: bool = False,
) -> None:  # fmt: skip
    rows, tokens, events = synthetic(workflows, cycles, capacity_blocks, vocab=vocab)
    write_metrics(folder, scrapes, max(r["end_ns"] for r in rows))
    if traced:
        write_traced(folder, rows)
    empty = dict.fromkeys(requests.COLUMNS)
    with (folder / requests.REQUESTS_JSONL).open("w") as f:
        for n, r in enumerate(rows):
            f.write(line(empty | CONSTANT | r | filled(r, n)))
    with token_writer(folder / TOKENS_ARROW) as w:
        t = time.perf_counter()
        for uuid, ids in tokens.items():  # as probe.instrument hands them over: a tuple of ints
            w.append(PromptTokenIds(uuid, tuple(ids.tolist())))
        per = (time.perf_counter() - t) / max(len(tokens), 1)
    print(f"prompt ids written: {per * 1e6:.0f} us a call (~{len(ids)} ids)")
    t = time.perf_counter()
    merge_parts(folder)  # as a capture's close does: the stream rewritten in large batches
    print(f"prompt ids compacted at close: {time.perf_counter() - t:.1f} s")
    del rows, tokens
    with ArrowWriter(folder / KV_EVENTS_ARROW, BATCHES_SCHEMA, KvBatch.to_batch) as kv:
        batch: Any = None
        kept: list[Any] = []
        t, n = time.perf_counter(), 0
        for b, e in [*events, (None, None)]:  # the events of one batch are consecutive
            if b is not batch and batch is not None:
                kv.append(replace(batch, received_ns=batch.ts_ns, events=tuple(kept)))
                kept, n = [], n + 1
            batch = b
            if e is not None:
                kept.append(replace(e, token_ids=tuple(np.asarray(e.token_ids).tolist())))
        print(f"KV batches written: {(time.perf_counter() - t) / max(n, 1) * 1e6:.0f} us a batch")
    t = time.perf_counter()
    compact(folder / KV_EVENTS_ARROW, BATCHES_SCHEMA)  # as the listener's stop does
    print(f"KV batches compacted at stop: {time.perf_counter() - t:.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workflows", type=int, default=100)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--capacity-blocks", type=int, default=400)
    p.add_argument("--vocab", type=int, default=50_000,
                   help="token ids drawn below this (SmolLM2: 49,152; ids past 65,535 are held "
                        "in 4 bytes, not 2)")  # fmt: skip
    p.add_argument("--scrapes", type=int, default=25_000,
                   help="/metrics scrapes in the run (a 0.2 s interval over ~83 min)")  # fmt: skip
    p.add_argument("--keep", type=Path, help="Write the run here and keep it (default: a tmp dir).")
    p.add_argument(
        "--publish",
        action="store_true",
        help="finalize and publish as `kvscope run` does, MLflow traces included",
    )
    p.add_argument(
        "--traces-before-analysis",
        action="store_true",
        help="with --publish: start the trace writer once the tables are written, beside the "
        "analysis (publish's trace_job), not at publish",
    )
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = a.keep or Path(tmp) / "run"
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        write_run(folder, a.workflows, a.cycles, a.capacity_blocks, a.scrapes, a.vocab, a.publish)
        sizes = {p.name: p.stat().st_size / 2**20 for p in sorted(folder.glob("*.*"))}
        print(f"run written in {time.perf_counter() - t0:.1f} s: "
              + ", ".join(f"{n} {s:,.0f} MiB" for n, s in sizes.items()))  # fmt: skip
        if a.publish:
            here = str(Path(__file__).parent)
            early = ["early"] if a.traces_before_analysis else []
            done = subprocess.run([sys.executable, "-c", PUBLISH_CHILD, here, str(folder), *early])
            sys.exit(done.returncode)
        t1 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True
        )
        wall = time.perf_counter() - t1
        if done.returncode:
            sys.exit(f"finalize failed:\n{done.stderr}")
        # the child's own high-water mark (VmHWM, its memory after exec): the children's
        # ru_maxrss also counts the parent's pages the child was spawned with
        inside, rows, blocks, peak = done.stdout.split()[-4:]
        print(
            f"finalize: {rows} requests, {blocks} block lives; {float(inside):.2f} s in "
            f"finalize(), {wall:.2f} s with the child's start; peak {int(peak):,} MiB"
        )


if __name__ == "__main__":
    main()
