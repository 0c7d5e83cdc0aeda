"""Rows built off the app's thread (probe/offload.py, probe/streams.py): one row per call with the
worker, a full queue counted and its rows built inline, close flushing the queue, and a worker
that fails or dies said so, with no row lost."""

import asyncio
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from vllm_stub import Stub

from kvscope.config import EngineConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.probe.intercept import Interceptor
from kvscope.probe.offload import Offload
from kvscope.probe.streams import CallStreams, Flat
from kvscope.probe.wire import RunInfo
from kvscope.records.base import read_jsonl
from kvscope.records.payloads import PAYLOADS_JSONL, CallPayload
from kvscope.records.requests import COLUMNS, REQUESTS_JSONL, RequestRecord

BASE = "http://engine:8000"
HI = [{"role": "user", "content": "hi"}]
RUN = RunInfo("bench-1", "exp", "hash", "langgraph", 1, "smollm2", None)


def session_streams(run_dir: Path) -> CallStreams:
    (run_dir / "run.json").write_text(json.dumps({"benchmark_run_id": "bench-1"}))
    return CallStreams(run_dir, tokens=False, payloads=True)


def calls(streams: CallStreams, n: int) -> None:
    """`n` calls (a multiple of 16): half of them streamed, from 8 async tasks at once."""
    assert n % 16 == 0
    ctx = streams.context(RUN, None, store_prompts=False)
    stub = Stub()
    sync = openai.OpenAI(base_url=f"{BASE}/v1", api_key="x", max_retries=0,
                         http_client=httpx2.Client(transport=stub.transport(httpx2)))  # fmt: skip
    http = httpx2.AsyncClient(transport=stub.transport(httpx2, asynchronous=True))
    aio = openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http)

    async def streamed(k: int) -> None:
        for _ in range(k):
            stream = await aio.chat.completions.create(model="m", messages=HI, stream=True)
            assert [c async for c in stream]

    with Interceptor(VllmEngine(EngineConfig()), BASE, ctx):
        for _ in range(n // 2):
            assert sync.chat.completions.create(model="m", messages=HI).choices[0].message

        async def many() -> None:
            await asyncio.gather(*(streamed((n - n // 2) // 8) for _ in range(8)))

        asyncio.run(many())


def queue_stats(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())["capture"]["probe_queue"]


def test_every_call_is_one_row_with_the_worker(tmp_path: Path) -> None:
    streams = session_streams(tmp_path)
    calls(streams, 48)
    streams.close()
    rows, torn = read_jsonl(tmp_path / REQUESTS_JSONL)
    assert torn == 0 and len(rows) == 48 and len({r["request_uuid"] for r in rows}) == 48
    assert all(r["status"] == "ok" and r["prompt_tokens"] is not None for r in rows)
    assert sum(r["ttft_ms"] is not None for r in rows) == 24  # the streamed ones
    payloads = read_jsonl(tmp_path / PAYLOADS_JSONL)[0]
    assert {p["request_uuid"] for p in payloads} == {r["request_uuid"] for r in rows}
    stats = queue_stats(tmp_path)
    assert stats["offloaded"] == 48 and stats["inline"] == stats["failed"] == 0
    assert stats["died"] is None


def test_a_full_queue_builds_rows_inline_counted_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    streams = session_streams(tmp_path)
    assert streams.offload is not None
    streams.offload.close()
    streams.offload = Offload(maxsize=2)
    started, release = threading.Event(), threading.Event()
    assert streams.offload.submit(lambda: started.set() or release.wait(30))
    assert started.wait(10)  # the worker is busy...
    assert streams.offload.submit(lambda: None)
    assert streams.offload.submit(lambda: None)  # ...and its queue full
    calls(streams, 16)
    inline = len(read_jsonl(tmp_path / REQUESTS_JSONL)[0])
    assert inline == 16  # written while the worker was stuck: on the app's thread
    release.set()
    with caplog.at_level(logging.WARNING):
        streams.close()
    assert len(read_jsonl(tmp_path / REQUESTS_JSONL)[0]) == 16
    stats = queue_stats(tmp_path)
    assert stats["inline"] == 16 and stats["offloaded"] == 3 and stats["failed"] == 0
    assert "full queue: 16" in caplog.text


def test_close_runs_what_is_still_queued() -> None:
    offload = Offload()
    done: list[int] = []
    gate = threading.Event()
    offload.submit(lambda: gate.wait(30))
    for i in range(100):
        assert offload.submit(lambda i=i: done.append(i))
    assert not done
    gate.set()
    stats = offload.close()
    assert done == list(range(100)) and stats.offloaded == 101
    assert not offload.submit(lambda: None)  # closed: the caller runs it


def test_flush_waits_for_the_queue() -> None:
    offload = Offload()
    done: list[int] = []
    for i in range(50):
        offload.submit(lambda i=i: done.append(i))
    offload.flush()
    assert len(done) == 50
    offload.close()


def test_a_failing_job_is_counted_logged_and_the_worker_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    streams = session_streams(tmp_path)
    written = streams.row
    broken = {"n": 0}

    def sink(record: RequestRecord) -> None:  # the first row's write fails
        broken["n"] += 1
        if broken["n"] == 1:
            raise RuntimeError("the disk said no")
        written(record)

    streams.row = sink  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        calls(streams, 16)
        streams.close()
    assert len(read_jsonl(tmp_path / REQUESTS_JSONL)[0]) == 15
    stats = queue_stats(tmp_path)
    assert stats["failed"] == 1 and stats["error"] == "RuntimeError: the disk said no"
    assert "the disk said no" in caplog.text and "could not be written: 1" in caplog.text


def test_a_dead_worker_is_said_so_and_its_queue_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    offload = Offload()
    gate = threading.Event()
    done: list[int] = []
    offload.submit(lambda: gate.wait(30))

    def die() -> None:
        raise SystemExit("killed")

    offload.submit(die)
    for i in range(5):
        offload.submit(lambda i=i: done.append(i))  # queued behind the job that kills it
    with caplog.at_level(logging.ERROR):
        gate.set()
        offload._thread.join(10)
    assert not offload._thread.is_alive() and offload.stats.died == "SystemExit: killed"
    assert "row writer thread stopped" in caplog.text
    assert not offload.submit(lambda: done.append(99))  # the caller runs it, counted
    offload.flush()
    stats = offload.close()
    assert done == [0, 1, 2, 3, 4] and stats.inline == 1 and stats.failed == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_runs_jobs_itself() -> None:
    offload = Offload()
    pid = os.fork()
    if pid == 0:  # the worker thread is not in the child: the caller must run the job
        os._exit(0 if not offload.submit(lambda: None) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert offload.submit(lambda: None)
    offload.close()


def test_a_flat_record_is_the_same_line() -> None:
    values: dict[str, Any] = {c: None for c in COLUMNS}
    values |= {"request_uuid": "u", "status": "ok", "start_ns": 1, "end_ns": 2,
               "prompt_layout": ("a", "b"), "ttft_ms": 1.5,
               "prompt_token_mismatch": False}  # fmt: skip
    record = RequestRecord(**values)
    assert json.dumps(Flat(record).to_dict()) == json.dumps(record.to_dict())
    payload = CallPayload("u", {"messages": [{"role": "user", "content": "hé"}], "n": 1}, None)
    assert json.dumps(Flat(payload).to_dict()) == json.dumps(payload.to_dict())
