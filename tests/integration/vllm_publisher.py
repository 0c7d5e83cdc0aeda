"""Publishes KV event batches with vLLM's own publisher (run by vLLM's Python, not kvscope's).

argv: endpoint replay_endpoint out.json. Writes what it published (hashes, tokens, sessions) to
out.json, then serves replay requests for a few seconds.
"""

import json
import sys
import time

from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

endpoint, replay, out = sys.argv[1:4]
pub = ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay, topic="kv-events")
time.sleep(1.0)  # connect to the subscriber's bound socket
sent = []
for i in range(5):
    base = 1_000 * (i + 1)
    stored = BlockStored(
        block_hashes=[base + 1, 2**64 - base],  # one above 2**63: unsigned on the wire
        parent_block_hash=None if i == 0 else 1_001,
        token_ids=list(range(base, base + 8)),
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id=f"request-{i}",
    )
    events = [stored]
    if i == 3:
        events.insert(0, BlockRemoved(block_hashes=[2_001], medium="GPU"))
    if i == 4:
        events.insert(0, AllBlocksCleared())
    pub.publish(KVEventBatch(ts=time.time(), events=events))
    sent.append([type(e).__name__ for e in events])
    time.sleep(0.1)
with open(out, "w") as f:
    json.dump(sent, f)
time.sleep(6.0)  # the listener asks the replay socket at stop
pub.shutdown()
