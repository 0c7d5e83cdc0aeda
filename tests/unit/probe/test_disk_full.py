"""The disk filling up under the run directory (ENOSPC injected into the stream writers): the
app's calls go on untouched, the rows written before are kept, and the error names the file."""

import errno
import json
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from vllm_stub import Stub

from kvscope.config import EngineConfig
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import WriteError
from kvscope.probe.intercept import Interceptor
from kvscope.probe.streams import CallStreams
from kvscope.probe.wire import RunInfo
from kvscope.records.base import JsonlWriter
from kvscope.records.status import RunStatus

BASE = "http://engine:8000"


class FillsUp:
    """A file that takes `room` writes, then fails as a full disk does."""

    def __init__(self, real: Any, room: int) -> None:
        self.real, self.room = real, room

    def write(self, text: str) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= 1
        return self.real.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_rows_before_a_full_disk_are_kept_and_the_error_names_the_file(tmp_path: Path) -> None:
    streams = CallStreams(tmp_path, tokens=False, payloads=False)
    streams.requests._file = FillsUp(streams.requests._file, room=2)  # type: ignore[assignment]
    run = RunInfo("bench-1", "exp", "hash", "langgraph", 1, "smollm2", None)
    ctx = streams.context(run, None, store_prompts=False)
    http = httpx2.Client(transport=Stub().transport(httpx2))
    client = openai.OpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http, max_retries=0)
    with Interceptor(VllmEngine(EngineConfig()), BASE, ctx):
        replies = [
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            for _ in range(4)
        ]
    streams.close()
    assert all(r.choices[0].message.content for r in replies)  # the app never noticed
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["status"] == "ok" for line in lines)
    err = streams.write_error
    assert isinstance(err, WriteError)
    assert str(tmp_path / "requests.jsonl") in str(err) and "No space left" in str(err)
    status = RunStatus.of([json.loads(line) for line in lines], failure=err)
    assert status.state == "failed" and "requests.jsonl" in (status.reason or "")


def test_a_writer_says_which_file(tmp_path: Path) -> None:
    class Line:
        def to_dict(self) -> dict[str, int]:
            return {"a": 1}

    writer: JsonlWriter[Line] = JsonlWriter(tmp_path / "tools.jsonl")
    writer._file = FillsUp(writer._file, room=0)  # type: ignore[assignment]
    with pytest.raises(WriteError, match=r"tools\.jsonl: No space left on device"):
        writer.append(Line())
