"""The tokenizer process (probe/tokenizer_process.py): calls handed over by the tokenizer thread
are tokenized there exactly as in-process; where the process cannot take a call the thread
tokenizes it itself; a forked child starts a process of its own; nothing is lost or doubled."""

import os
import time
from pathlib import Path

from kvscope.probe.instrument import PromptInstrument
from kvscope.probe.streams import CallStreams
from kvscope.probe.tokens import ChatTokenizer
from kvscope.probe.wire import Instrument, RunInfo
from kvscope.records import prompt_columns
from kvscope.records.tokens import load_tokens

INFO = RunInfo("run", "exp", "h", "app", None, "m", None)


def body(i: int) -> dict:
    words = " ".join(f"w{(i * 7 + k) % 50}" for k in range(1 + i % 9))
    return {"model": "m", "messages": [{"role": "system", "content": "w1 w2"},
                                       {"role": "user", "content": words}]}  # fmt: skip


def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir(exist_ok=True)
    return path


def capture(out: Path, chat: ChatTokenizer) -> tuple[CallStreams, Instrument]:
    """A capture's streams in `out` and its instrument, tokenizing in the process."""
    streams = CallStreams(out, tokens=True, payloads=False)
    ctx = streams.context(INFO, chat, store_prompts=False)
    assert ctx.instrument is not None and streams.tokenizer_process is not None
    return streams, ctx.instrument


def wait_for(predicate, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_many_calls_are_tokenized_in_the_process_as_in_process(
    tmp_path: Path, chat: ChatTokenizer
) -> None:
    out = run_dir(tmp_path)
    streams, instrument = capture(out, chat)
    for i in range(300):
        assert instrument(body(i), f"u{i}", {"fixed_messages": 1}, None, None, None) == {}
    streams.close()
    inline = PromptInstrument(chat, None)
    records = {r["request_uuid"]: r for r in prompt_columns.read(out)}
    assert len(records) == 300 and prompt_columns.tokenized_on(out) == {"process": 300}
    ids = load_tokens(out)
    for i in (0, 1, 150, 299):
        want = inline.columns(body(i), f"u{i}", {"fixed_messages": 1}, None, None)
        assert records[f"u{i}"] == {"request_uuid": f"u{i}", "serialized_prompt_text": None,
                                    **want, "tokenized_on": "process"}  # fmt: skip
        text = chat.render(body(i)["messages"])
        assert ids[f"u{i}"].tolist() == chat.encode_text(text)
    assert streams.tokenizer_process is not None and streams.tokenizer_process.sent == 300


def test_a_process_that_died_leaves_the_calls_to_the_thread(
    tmp_path: Path, chat: ChatTokenizer
) -> None:
    out = run_dir(tmp_path)
    streams, instrument = capture(out, chat)
    instrument(body(1), "first", {}, None, None, None)
    wait_for(lambda: any(p.stat().st_size for p in out.glob("prompt_columns.jsonl.*")))
    proc = streams.tokenizer_process._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    for i in range(2, 6):
        instrument(body(i), f"later{i}", {}, None, None, None)
    streams.close()
    where = {r["request_uuid"]: r["tokenized_on"] for r in prompt_columns.read(out)}
    assert where == {"first": "process", **{f"later{i}": "worker" for i in range(2, 6)}}
    assert set(load_tokens(out)) == set(where)


def test_a_forked_child_tokenizes_in_a_process_of_its_own(
    tmp_path: Path, chat: ChatTokenizer
) -> None:
    out = run_dir(tmp_path)
    streams, instrument = capture(out, chat)
    instrument(body(1), "parent-1", {}, None, None, None)
    wait_for(lambda: streams.tokenizer_process is not None and streams.tokenizer_process.sent == 1)
    parent_proc = streams.tokenizer_process._proc
    pid = os.fork()
    if pid == 0:  # the child: its own part files, its own tokenizer process
        code = 1
        try:
            streams.reopen(f".{os.getpid()}")
            instrument(body(2), "child-1", {}, None, None, None)
            streams.close()
            code = 0 if streams.tokenizer_process._proc is None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    instrument(body(3), "parent-2", {}, None, None, None)
    assert streams.tokenizer_process._proc is parent_proc  # the parent's is still its own
    streams.close()
    records = prompt_columns.read(out)
    assert sorted(r["request_uuid"] for r in records) == ["child-1", "parent-1", "parent-2"]
    assert {r["tokenized_on"] for r in records} == {"process"}
    assert set(load_tokens(out)) == {"child-1", "parent-1", "parent-2"}


def test_the_process_renders_chats_as_the_engine_serves_them(tmp_path: Path) -> None:
    """A trailing assistant message is the user's where the engine serves it so (SGLang): the
    process is told, and tokenizes as the engine renders."""
    from conftest import make_chat

    replied = body(3)
    written = [*replied["messages"], {"role": "assistant", "content": "w9 w8"}]
    served = [*replied["messages"], {"role": "user", "content": "w9 w8"}]
    replied["messages"] = written
    for trailing, messages in ((False, written), (True, served)):
        chat = make_chat(tmp_path / str(trailing), trailing_assistant_as_user=trailing)
        out = run_dir(tmp_path / str(trailing))
        streams, instrument = capture(out, chat)
        instrument(replied, "u", {}, None, None, None)
        streams.close()
        assert prompt_columns.tokenized_on(out) == {"process": 1}
        assert load_tokens(out)["u"].tolist() == chat.encode_text(chat.render(messages))
