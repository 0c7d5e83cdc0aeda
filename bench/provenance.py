"""How long the Level 3 analysis takes on a large run, and its peak memory. Prints numbers.

Builds a synthetic run without an engine: W workflows x C cycles x 4 PEER agents, each prompt a
shared prefix + the agent's fixed part + a fresh suffix, with the BlockStored / BlockRemoved
events an LRU cache of a given size would publish. Then times the ledger, per-request provenance
and first-divergence passes that every run's finalize step does.

    .venv/bin/python bench/provenance.py --workflows 100 --cycles 3
"""

import argparse
import random
import resource
import time
from collections import OrderedDict

from kvscope.finalize.divergence import with_divergence
from kvscope.finalize.provenance import build_ledger, chain_key, provenance
from kvscope.records.kv_events import KvBatch, KvEvent

AGENTS = ("planner", "executor", "expresser", "reviewer")
BLOCK = 128


def synthetic(workflows: int, cycles: int, capacity_blocks: int, seed: int = 0):
    rng = random.Random(seed)
    shared = [rng.randrange(50_000) for _ in range(4 * BLOCK)]
    fixed = {a: [rng.randrange(50_000) for _ in range(3 * BLOCK)] for a in AGENTS}
    rows, tokens, events = [], {}, []
    cache: OrderedDict[int, None] = OrderedDict()  # block hash -> None, LRU order
    t, seq = 0, 0
    for c in range(cycles):
        for w in range(workflows):
            for i, agent in enumerate(AGENTS):
                uuid = f"w{w}-c{c}-{agent}"
                ids = shared + fixed[agent] + [rng.randrange(50_000) for _ in range(300)]
                keys, parent = [], 0
                for s in range(0, len(ids) - BLOCK + 1, BLOCK):
                    parent = chain_key(parent, ids[s : s + BLOCK])
                    keys.append(parent)
                hit = 0
                while hit < len(keys) and keys[hit] in cache:
                    cache.move_to_end(keys[hit])
                    hit += 1
                new = keys[hit:]
                removed = []
                while len(cache) + len(new) > capacity_blocks and cache:
                    removed.append(cache.popitem(last=False)[0])
                batch = KvBatch(seq=seq, ts_ns=t + 5)
                if removed:
                    events.append((batch, KvEvent("removed", tuple(removed))))
                if new:
                    events.append((batch, KvEvent(
                        "stored", tuple(new), keys[hit - 1] if hit else None,
                        tuple(ids[hit * BLOCK : len(keys) * BLOCK]), BLOCK, "GPU", uuid,
                    )))  # fmt: skip
                for k in new:
                    cache[k] = None
                rows.append({
                    "request_uuid": uuid, "workflow_run_id": f"w{w}", "agent_id": agent,
                    "turn_id": c + 1, "previous_agent_id": AGENTS[i - 1] if i or c else None,
                    "start_ns": t, "end_ns": t + 9, "status": "ok", "queue_ms": None,
                    "prompt_tokens": len(ids), "cached_tokens": hit * BLOCK,
                })  # fmt: skip
                tokens[uuid] = ids
                t, seq = t + 10, seq + 1
    return rows, tokens, events


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workflows", type=int, default=100)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--capacity-blocks", type=int, default=400)
    a = p.parse_args()
    t0 = time.perf_counter()
    rows, tokens, events = synthetic(a.workflows, a.cycles, a.capacity_blocks)
    t1 = time.perf_counter()
    ledger = build_ledger(events)
    t2 = time.perf_counter()
    prov = provenance(rows, tokens, ledger)
    t3 = time.perf_counter()
    with_divergence(prov.rows, tokens)
    t4 = time.perf_counter()
    evicted = sum(b["removal"] == "evicted" for b in prov.blocks)
    harmful = sum(b["harmful"] for b in prov.blocks)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n_tokens = sum(map(len, tokens.values()))
    print(f"requests {len(rows):,}  prompt tokens {n_tokens:,}  block lives {len(ledger.lives):,}"
          f"  evicted {evicted:,}  harmful {harmful:,}")  # fmt: skip
    print(f"build (not timed work): {t1 - t0:.2f} s")
    print(f"ledger     {t2 - t1:6.2f} s")
    print(f"provenance {t3 - t2:6.2f} s  ({(t3 - t2) / len(rows) * 1e3:.2f} ms / request)")
    print(f"divergence {t4 - t3:6.2f} s")
    print(f"peak RSS   {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
