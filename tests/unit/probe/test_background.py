"""A call's end off the app's thread: the background worker's contract, and a capture's rows and
prompt columns with it."""

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from kvscope.probe.background import THREAD_NAME, Background
from kvscope.probe.instrument import PromptInstrument
from kvscope.probe.streams import CallStreams
from kvscope.probe.tokens import ChatTokenizer
from kvscope.probe.wire import RunInfo
from kvscope.records import prompt_columns
from kvscope.records.requests import load_table
from kvscope.records.tokens import load_tokens

INFO = RunInfo("run", "exp", "h", "app", None, "m", None)


def test_jobs_run_once_each_on_the_workers_thread_in_order() -> None:
    worker, ran = Background(), []
    for i in range(50):
        assert worker.submit(lambda i=i: ran.append((i, threading.current_thread().name)))
    worker.close()
    assert [i for i, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {THREAD_NAME}
    assert (worker.counts.queued, worker.counts.inline, worker.counts.failed) == (50, 0, 0)
    assert not worker.submit(lambda: None)  # closed: the caller runs it


def test_a_full_queue_hands_the_job_back_counted_and_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker, release, started = Background(capacity=1), threading.Event(), threading.Event()
    ran: list[str] = []

    def blocking() -> None:
        started.set()
        release.wait(10)
        ran.append("first")

    assert worker.submit(blocking)
    assert started.wait(10)
    assert worker.submit(lambda: ran.append("second"))  # the one place in the queue
    with caplog.at_level(logging.WARNING):
        assert not worker.submit(lambda: ran.append("third"))
        assert not worker.submit(lambda: ran.append("fourth"))
    assert worker.counts.inline == 2
    assert sum("fell behind" in r.message for r in caplog.records) == 1  # said once
    release.set()
    worker.close()
    assert ran == ["first", "second"]  # the handed-back ones are the caller's to run
    assert worker.counts.queued == 2


def test_a_failing_job_is_logged_and_the_others_run(caplog: pytest.LogCaptureFixture) -> None:
    worker, ran = Background(), []

    def boom() -> None:
        raise RuntimeError("template exploded")

    with caplog.at_level(logging.ERROR):
        worker.submit(lambda: ran.append(1))
        worker.submit(boom)
        worker.submit(lambda: ran.append(3))
        worker.close()
    assert ran == [1, 3]
    assert worker.counts.failed == 1
    assert any("could not be written" in r.message for r in caplog.records)


def test_a_forked_child_runs_its_own_jobs(tmp_path: Path) -> None:
    worker, out = Background(), tmp_path / "child.txt"
    worker.submit(lambda: None)
    pid = os.fork()
    if pid == 0:  # the child: an empty queue, a thread of its own on its first job
        try:
            worker.submit(lambda: out.write_text(threading.current_thread().name))
            worker.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    worker.close()
    assert out.read_text() == THREAD_NAME


BODY = {
    "model": "m",
    "messages": [{"role": "system", "content": "w1 w2 w3"}, {"role": "user", "content": "w4"}],
}


def test_rows_go_out_at_once_and_their_prompt_columns_follow(
    tmp_path: Path, chat: ChatTokenizer
) -> None:
    """A capture's instrument hands tokenization to the worker, which hands it to the tokenizer
    process: the call's own columns come back empty, the same columns as an inline computation
    land in prompt_columns.jsonl, the ids in the token stream, and the request table reads them
    by request_uuid."""
    streams = CallStreams(tmp_path, tokens=True, payloads=False)
    ctx = streams.context(INFO, chat, store_prompts=True)
    assert ctx.instrument is not None
    hints = {"fixed_messages": 1}
    now = ctx.instrument(BODY, "u1", hints, None, 7, None)
    assert now == {"raw_messages_json": json.dumps(BODY["messages"])}  # no prompt column here
    streams.close()

    inline = PromptInstrument(chat, None, store_prompts=True).columns(BODY, "u1", hints, 7, None)
    assert inline["prompt_token_count"] == 7 and inline["fixed_prefix_tokens"] == 4
    (record,) = prompt_columns.read(tmp_path)
    assert record == {"request_uuid": "u1", **inline, "tokenized_on": "process"}
    assert prompt_columns.tokenized_on(tmp_path) == {"process": 1}
    assert not list(tmp_path.glob("*.jsonl.*")) and not list(tmp_path.glob("*.arrow.*"))
    assert load_tokens(tmp_path)["u1"].tolist() == list(chat.encode_text(chat.render(
        BODY["messages"])))  # fmt: skip


def test_engine_ids_stay_inline(tmp_path: Path, chat: ChatTokenizer) -> None:
    streams = CallStreams(tmp_path, tokens=True, payloads=False)
    ctx = streams.context(INFO, chat, store_prompts=False)
    assert ctx.instrument is not None
    got = ctx.instrument(BODY, "u2", {}, None, 3, [7, 8, 9])
    streams.close()
    assert got["prompt_token_source"] == "engine" and got["prompt_token_count"] == 3
    assert prompt_columns.read(tmp_path) == []


def test_the_request_table_takes_the_columns_by_uuid_in_row_order(tmp_path: Path) -> None:
    rows = [
        {"request_uuid": "a", "status": "ok", "prompt_tokens": 5},
        {"request_uuid": "b", "status": "ok", "prompt_tokens": 6, "prompt_token_source": "engine",
         "prompt_token_count": 6},
        {"request_uuid": "c", "status": "ok", "prompt_tokens": 7},
    ]  # fmt: skip
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    later = [
        {"request_uuid": "c", "prompt_token_source": "tokenizer", "prompt_token_count": 7,
         "prompt_token_mismatch": False, "token_id_hash": "h7", "tokenized_on": "worker"},
        {"request_uuid": "b", "prompt_token_source": "tokenizer", "prompt_token_count": 60,
         "tokenized_on": "app"},
    ]  # fmt: skip
    (tmp_path / prompt_columns.PROMPT_COLUMNS_JSONL).write_text(
        "".join(json.dumps(r) + "\n" for r in later)
    )
    table = load_table(tmp_path)
    assert table.column("request_uuid").to_pylist() == ["a", "b", "c"]
    assert table.column("prompt_token_source").to_pylist() == [None, "engine", "tokenizer"]
    assert table.column("prompt_token_count").to_pylist() == [None, 6, 7]  # b's own value kept
    assert table.column("token_id_hash").to_pylist() == [None, None, "h7"]
    assert table.column("prompt_token_count").type == pa.int64()
    assert prompt_columns.tokenized_on(tmp_path) == {"worker": 1, "app": 1}


def _streamed_calls(streams: CallStreams, n: int, run: Any = None) -> list[str]:
    """`n` streamed calls through a capture's context (vLLM's stub, its prompt ids asked for):
    the names of the threads each call's row was written on."""
    from test_intercept import sdk
    from vllm_stub import Stub

    from kvscope.config import EngineConfig
    from kvscope.engines.vllm import VllmEngine
    from kvscope.probe.intercept import Interceptor

    threads: list[str] = []
    streams.on_row = lambda _: threads.append(threading.current_thread().name)
    ctx = streams.context(INFO, None, store_prompts=False)
    client = sdk(Stub())
    with Interceptor(VllmEngine(EngineConfig()), "http://engine:8000", ctx):
        for _ in range(n):
            stream = client.chat.completions.create(model="m", messages=BODY["messages"],
                                                    stream=True)  # fmt: skip
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    return threads


def test_a_calls_row_is_made_and_written_off_the_apps_thread(tmp_path: Path) -> None:
    """The row (its prompt columns from the engine's ids included) is built on the background
    thread; after close every call is a complete row."""
    streams = CallStreams(tmp_path, tokens=True, payloads=True)
    threads = _streamed_calls(streams, 5)
    streams.close()
    assert threads == [THREAD_NAME] * 5
    table = load_table(tmp_path)
    assert table.num_rows == 5
    assert set(table.column("prompt_token_source").to_pylist()) == {"engine"}
    assert set(table.column("ttft_ms").to_pylist()) != {None}
    assert set(table.column("prompt_tokens").to_pylist()) == {592}
    assert len(load_tokens(tmp_path)) == 5
    assert len((tmp_path / "payloads.jsonl").read_text().splitlines()) == 5


def test_with_the_apps_mlflow_span_active_the_row_is_made_on_the_apps_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """probe/app_spans.py reads the app's active span, which only the app's thread sees."""
    monkeypatch.setattr("kvscope.probe.streams.app_spans.active", lambda: True)
    streams = CallStreams(tmp_path, tokens=True, payloads=False)
    threads = _streamed_calls(streams, 2)
    streams.close()
    assert threads == [threading.current_thread().name] * 2


def test_a_forked_process_writes_its_rows_on_its_own_thread(tmp_path: Path) -> None:
    """A multiprocessing worker ends with os._exit: nothing may wait on a thread there."""
    streams = CallStreams(tmp_path, tokens=True, payloads=False)
    pid = os.fork()
    if pid == 0:
        try:
            streams.reopen(f".{os.getpid()}")
            threads = _streamed_calls(streams, 1)
            (tmp_path / "child.txt").write_text(threads[0])
        finally:
            os._exit(0)  # no close: what was written is what is kept
    os.waitpid(pid, 0)
    assert (tmp_path / "child.txt").read_text() == threading.current_thread().name
    streams.close()
    assert load_table(tmp_path).num_rows == 1
