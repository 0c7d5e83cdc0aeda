"""kvscope's listener on batches published by vLLM's own ZmqEventPublisher (vLLM's Python)."""

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import free_port

from kvscope.collect.kv_events import KvEventListener
from kvscope.engines.kv_events import signed64
from kvscope.engines.vllm import venv_root
from kvscope.records.kv_events import read_batches

PYTHON = venv_root() / "bin" / "python"
SCRIPT = Path(__file__).with_name("vllm_publisher.py")

pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason="vLLM is not installed")


def test_listener_decodes_vllms_publisher(tmp_path: Path) -> None:
    port = free_port(2)
    listener = KvEventListener(
        f"tcp://127.0.0.1:{port}", tmp_path / "kv.jsonl", bind=True,
        replay_endpoint=f"tcp://127.0.0.1:{port + 1}",
    )  # fmt: skip
    listener.start()
    sent_path = tmp_path / "sent.json"
    proc = subprocess.Popen(
        [str(PYTHON), str(SCRIPT), f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}",
         str(sent_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not sent_path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sent_path.exists(), proc.stdout.read() if proc.stdout else "no output"
        summary = listener.stop()
    finally:
        proc.wait(30)
    sent = json.loads(sent_path.read_text())
    rows, bad = read_batches(tmp_path / "kv.jsonl")
    assert bad == 0 and summary.lost == 0
    # Every batch arrived (a first batch lost while the link formed came back by replay).
    assert [r.seq for r in rows] == list(range(len(sent)))
    assert summary.live + summary.recovered == len(sent)
    kinds = [[e.kind for e in r.events] for r in rows]
    names = {"BlockStored": "stored", "BlockRemoved": "removed", "AllBlocksCleared": "cleared"}
    assert kinds == [[names[n] for n in batch] for batch in sent]
    stored = [e for r in rows for e in r.events if e.kind == "stored"]
    assert [e.session_id for e in stored] == [f"request-{i}" for i in range(5)]
    first = stored[0]
    assert first.block_hashes == (1_001, signed64(2**64 - 1_000))
    assert first.token_ids == tuple(range(1_000, 1_008)) and first.block_size == 4
    assert stored[1].parent_block_hash == 1_001
