"""Record real vLLM CPU outputs for the unit tests (tests/fixtures/vllm-<version>/).

Needs the embedded engine installed (`kvscope engine install`). Starts it with a small KV cache
(so that evictions happen), sends a few requests, and saves what vLLM's own code produced:
a /metrics scrape, a streamed and a non-streamed chat response, /v1/models, and every KV event
frame (raw msgpack, base64) including evictions and a cache reset.

    .venv/bin/python scripts/record_vllm_fixtures.py
"""

import base64
import json
import sys
import time
from pathlib import Path

import httpx

from kvscope.config import EngineConfig
from kvscope.engines import make_engine
from kvscope.engines.kv_events import receive, replay, subscriber
from kvscope.engines.runtime import running
from kvscope.engines.vllm import VERSION

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / f"vllm-{VERSION}"


def prompt(agent: str, n: int) -> list[dict[str, str]]:
    lines = "\n".join(f"{agent} rule {i}: keep entry {i * 7 % 31} balanced." for i in range(n))
    return [{"role": "system", "content": lines}, {"role": "user", "content": "Go."}]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    cfg = EngineConfig(port=8123, kv_events_port=5623, context_length=1024, kv_capacity_tokens=2048)
    with running(make_engine(cfg), OUT / "engine.log") as handle:
        ep = handle.endpoints
        base = ep.base_url
        frames: list[dict[str, object]] = []
        with httpx.Client(timeout=120) as client, subscriber(ep.kv_events, True) as sock:
            time.sleep(0.5)
            (OUT / "models.json").write_text(client.get(f"{base}/v1/models").text)
            order = ["planner", "executor", "planner", "expresser", "reviewer", "planner"]
            for i, agent in enumerate(order):
                body = {
                    "model": "smollm2", "messages": prompt(agent, 40), "max_tokens": 8,
                    "temperature": 0, "session_id": agent,
                }  # fmt: skip
                if i == 0:
                    r = client.post(f"{base}/v1/chat/completions", json=body)
                    (OUT / "chat_completion.json").write_text(r.text)
                else:
                    body |= {"stream": True, "stream_options": {"include_usage": True}}
                    r = client.post(f"{base}/v1/chat/completions", json=body)
                    if i == 2:
                        (OUT / "chat_completion_stream.sse").write_text(r.text)
            r = client.post(f"{base}/reset_prefix_cache")
            r.raise_for_status()
            client.post(f"{base}/v1/chat/completions", json={
                "model": "smollm2", "messages": prompt("after-reset", 20), "max_tokens": 2,
            })  # fmt: skip
            receive(sock, 3.0)  # drain; the exact bytes of every batch come from replay below
            (OUT / "metrics.prom").write_text(client.get(f"{base}/metrics").text)
        raw = {}
        # Re-read every batch from the replay socket: it holds the exact bytes of all of them.
        import zmq

        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.connect(ep.kv_events_replay)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while dealer.poll(3000):
            _, topic, seq_b, payload = dealer.recv_multipart()
            seq = int.from_bytes(seq_b, "big", signed=True)
            if seq == -1:
                break
            raw[seq] = (topic, payload)
        dealer.close(linger=0)
        for seq in sorted(raw):
            topic, payload = raw[seq]
            frames.append({
                "topic_hex": topic.hex(), "seq": seq,
                "payload_b64": base64.b64encode(payload).decode(),
            })  # fmt: skip
        assert len(replay(ep.kv_events_replay)) == len(frames)
    with (OUT / "kv_events.frames.jsonl").open("w") as f:
        for frame in frames:
            f.write(json.dumps(frame) + "\n")
    (OUT / "engine.log").unlink()
    print(f"recorded {len(frames)} KV event batches into {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
