"""How long the Level 3 analysis takes on a large run, and its peak memory. Prints numbers.

Builds a synthetic run without an engine: W workflows x C cycles x 4 PEER agents, each prompt a
shared prefix + the agent's fixed part + a fresh suffix, with the BlockStored / BlockRemoved
events an LRU cache of a given size would publish. Then times the first-divergence, ledger and
per-request provenance passes that every run's finalize step does, in finalize's order and
holding what finalize holds (finalize.tables: the rows with the divergence columns replace the
rows read; the caller keeps them, the events and the prompts through provenance), and prints the
process's peak RSS and its RSS once the run was built (the inputs: prompts as int32 arrays,
events' tokens as views of them, request rows as dicts, events as KvBatch / KvEvent objects).
The peak is the whole process's: the inputs, the interpreter and libraries, and what the passes
allocate (pyarrow's first table imports pandas: ~38 MiB).

    .venv/bin/python bench/provenance.py --workflows 100 --cycles 3
"""

import argparse
import os
import resource
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import pyarrow.compute as pc

from kvscope.finalize.divergence import with_divergence
from kvscope.finalize.provenance import build_ledger, provenance
from kvscope.records.blockkey import prompt_blocks
from kvscope.records.kv_events import KvBatch, KvEvent

AGENTS = ("planner", "executor", "expresser", "reviewer")
BLOCK = 128
SUFFIX = 300

Run = tuple[list[dict[str, Any]], dict[str, np.ndarray], list[tuple[KvBatch, KvEvent]]]


def synthetic(
    workflows: int, cycles: int, capacity_blocks: int, seed: int = 0, vocab: int = 50_000
) -> Run:
    """The run's request rows, prompt tokens (request_uuid -> int32 array, ids below `vocab`)
    and KV events."""
    rng = np.random.default_rng(seed)
    n = workflows * cycles * len(AGENTS)
    shared = rng.integers(vocab, size=4 * BLOCK, dtype=np.int32)
    fixed = rng.integers(vocab, size=(len(AGENTS), 3 * BLOCK), dtype=np.int32)
    head = np.concatenate([np.broadcast_to(shared, (len(AGENTS), len(shared))), fixed], axis=1)
    prompts = np.empty((n, head.shape[1] + SUFFIX), dtype=np.int32)
    # filled in place (a tiled copy of the heads was a 342 MiB transient at 100k requests)
    prompts[:, : head.shape[1]].reshape(n // len(AGENTS), len(AGENTS), -1)[:] = head
    prompts[:, head.shape[1] :] = rng.integers(vocab, size=(n, SUFFIX), dtype=np.int32)
    keys, _, offsets = prompt_blocks(prompts, BLOCK)
    # the events' block hashes: the keys as int64 (engines' hashes fit the table's int64 column),
    # made Python ints one request at a time (a list of all of them left ~50 MiB of freed,
    # fragmented memory resident under the run)
    keys64, bounds = keys.view(np.int64), offsets.tolist()
    rows, tokens, events = [], {}, []
    cache: OrderedDict[int, None] = OrderedDict()  # block hash -> None, LRU order
    j = 0
    for c in range(cycles):
        for w in range(workflows):
            for i, agent in enumerate(AGENTS):
                uuid, t = f"w{w}-c{c}-{agent}", 10 * j
                mine = keys64[bounds[j] : bounds[j + 1]].tolist()
                hit = 0
                while hit < len(mine) and mine[hit] in cache:
                    cache.move_to_end(mine[hit])
                    hit += 1
                new = mine[hit:]
                removed = []
                while len(cache) + len(new) > capacity_blocks and cache:
                    removed.append(cache.popitem(last=False)[0])
                batch = KvBatch(seq=j, ts_ns=t + 5)
                if removed:
                    events.append((batch, KvEvent("removed", tuple(removed))))
                if new:
                    events.append((batch, KvEvent(
                        "stored", tuple(new), mine[hit - 1] if hit else None,
                        prompts[j, hit * BLOCK : len(mine) * BLOCK], BLOCK, "GPU", uuid,
                    )))  # fmt: skip
                for k in new:
                    cache[k] = None
                rows.append({
                    "request_uuid": uuid, "workflow_run_id": f"w{w}", "agent_id": agent,
                    "turn_id": c + 1, "previous_agent_id": AGENTS[i - 1] if i or c else None,
                    "start_ns": t, "end_ns": t + 9, "status": "ok", "queue_ms": None,
                    "prompt_tokens": prompts.shape[1], "cached_tokens": hit * BLOCK,
                })  # fmt: skip
                tokens[uuid] = prompts[j]
                j += 1
    return rows, tokens, events


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workflows", type=int, default=100)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--capacity-blocks", type=int, default=400)
    a = p.parse_args()
    t0 = time.perf_counter()
    rows, tokens, events = synthetic(a.workflows, a.cycles, a.capacity_blocks)
    n_rows, built = len(rows), rss_mib()
    # the passes in finalize's order (finalize.tables): the rows with the divergence columns
    # replace the rows read, then each cache's ledger and provenance, the caller holding the rows
    t1 = time.perf_counter()
    rows = with_divergence(rows, tokens)
    t2 = time.perf_counter()
    ledger = build_ledger(events)
    t3 = time.perf_counter()
    prov = provenance(rows, tokens, ledger)
    t4 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    evicted = pc.sum(pc.equal(prov.table.column("removal"), "evicted")).as_py() or 0
    harmful = pc.sum(prov.table.column("harmful")).as_py() or 0
    n_tokens = sum(map(len, tokens.values()))
    print(f"requests {n_rows:,}  prompt tokens {n_tokens:,}  block lives {prov.table.num_rows:,}"
          f"  evicted {evicted:,}  harmful {harmful:,}")  # fmt: skip
    print(f"build (not timed work): {t1 - t0:.2f} s, RSS then {built:,.0f} MiB")
    print(f"ledger     {t3 - t2:6.2f} s")
    print(f"provenance {t4 - t3:6.2f} s  ({(t4 - t3) / n_rows * 1e3:.3f} ms / request)")
    print(f"divergence {t2 - t1:6.2f} s")
    print(f"total      {t4 - t1:6.2f} s  ({(t4 - t1) / n_rows * 1e3:.3f} ms / request)")
    print(f"peak RSS   {peak:,.0f} MiB  (above the built run: {peak - built:,.0f} MiB)")
    print(f"load       {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
