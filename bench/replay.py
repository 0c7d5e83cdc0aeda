"""How fast the prefix-cache simulator replays a PEER-like trace, per policy.

The trace: workflows of PEER's four agents (planner, executor, expresser, reviewer) in cycles,
a few workflows in flight at once, each request's prompt = a prefix shared by all + its agent's
fixed part + its workflow's context, growing each step + a fresh suffix (~1.5k tokens), and
128 output tokens. Block keys are generated directly (Mooncake-like hash ids, chained here by a
polynomial hash), not through token ids; `chain_keys` on token ids is timed on a sample apart.

Each policy runs in a child process that loads the trace and simulates it: wall seconds are the
`simulate()` call only; peak memory is the child's ru_maxrss (the whole process: interpreter,
numpy, the trace and the simulation; VmHWM), and its RSS just before `simulate()`.

    PYTHONPATH=src python bench/replay.py [--requests 100000] [--policies lru,belady]
        [--engine vllm,sglang] [--check]
    PYTHONPATH=src python bench/replay.py --load-tokens 20000000 [--requests 2000]

`--engine`: "vllm" (the block pool), "sglang" (the radix cache; only its policies run there) or
both, comma-separated. `--check`: the same at 25k, 50k and 100k requests: is the cost linear?
`--anchors`: instead, kvscope against kvlint 0.1.1 (its vLLM block simulator) and prefixlens
0.1.0 (its radix LRU) on one token-id trace (--requests requests on 60 Zipf-popular prefixes),
at each of --anchor-blocks capacities: cached tokens, CPU seconds and peak RSS of each, each in
a child. The two are installed by this bench in their own venv (ANCHORS_VENV, default
~/.cache/kvscope-bench/anchors), never in kvscope's. kvscope runs --prompt-only, vLLM semantics
head-first (kvlint's rules: expected equal) and SGLang semantics (prefixlens evicts single
pages, SGLang whole nodes: not expected equal).
`--limit`: instead, issue 31's limit (bench/replay_limit.py): a 100k-request trace from
hash_ids and from token ids, kvscope against kvlint's streamed simulator, and the LRU sweep.
`--load-tokens N`: instead, how long `load_source` takes to read a token-id trace (JSONL) of
about N prompt tokens over `--requests` requests and the same requests as a Mooncake trace
(--block-size), each in a child process: CPU and wall seconds, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kvscope.sim.trace import Trace, chain_keys

AGENTS = ("planner", "executor", "expresser", "reviewer")
SHARED, FIXED, CONTEXT_STEP, SUFFIX, OUTPUT = 16, 48, 5, 4, 128  # blocks; output in tokens
CYCLES, IN_FLIGHT = 3, 6


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads small ids over 64 bits."""
    with np.errstate(over="ignore"):
        x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def peer_trace(n: int, block_size: int = 16, seed: int = 0) -> Trace:
    """n requests of PEER-like workflows; see the module docstring."""
    rng = np.random.default_rng(seed)
    steps = len(AGENTS) * CYCLES
    req = np.arange(n)
    wf, step = req // steps, req % steps
    agent = step % len(AGENTS)
    ctx = CONTEXT_STEP * step
    counts = (SHARED + FIXED + SUFFIX + ctx).astype(np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    local = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], counts)
    r = np.repeat(req, counts)
    content = np.where(
        local < SHARED,
        local,
        np.where(
            local < SHARED + FIXED,
            (1 << 20) + np.repeat(agent, counts) * 1000 + local,
            np.where(
                local < SHARED + FIXED + np.repeat(ctx, counts),
                (1 << 40) + np.repeat(wf, counts) * 1000 + local,
                (1 << 50) + np.arange(total),
            ),
        ),
    )
    c = _mix(content)
    with np.errstate(over="ignore"):  # key_k = sum_j c_j * 3^(k-j), per request, vectorised
        pw = np.ones(int(counts.max()) + 1, dtype=np.uint64)
        pw[1:] = np.uint64(3)
        pw = np.cumprod(pw, dtype=np.uint64)
        inv = np.ones_like(pw)
        inv[1:] = np.uint64(pow(3, -1, 1 << 64))
        inv = np.cumprod(inv, dtype=np.uint64)
        run = np.cumsum(c * inv[local], dtype=np.uint64)
        base = np.concatenate([[np.uint64(0)], run])[offsets[:-1]]
        keys = (run - np.repeat(base, counts)) * pw[local]
    del r, content, c, local
    # workflows: IN_FLIGHT lanes, each runs its workflows back to back
    dur = rng.uniform(1.0, 3.0, size=n)
    start, end = np.empty(n), np.empty(n)
    lane_t = np.zeros(IN_FLIGHT)
    for w in range(int(wf.max()) + 1):
        lane = w % IN_FLIGHT
        lo, hi = w * steps, min((w + 1) * steps, n)
        d = dur[lo:hi]
        e = lane_t[lane] + np.cumsum(d + 0.01)
        start[lo:hi], end[lo:hi] = e - d, e
        lane_t[lane] = e[-1] + rng.uniform(0, 1)
    extra = rng.integers(0, block_size, size=n)
    names = tuple(AGENTS[a] for a in agent.tolist())
    prev = tuple(None if s == 0 else AGENTS[(a - 1) % 4] for s, a in zip(step, agent, strict=True))
    return Trace(
        f"peer-like n={n}",
        block_size,
        tuple(map(str, range(n))),
        start,
        end,
        counts * block_size + extra,
        np.full(n, OUTPUT, dtype=np.int64),
        keys,
        offsets,
        names,
        tuple(f"w{w}" for w in wf.tolist()),
        prev,
    )


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    """VmHWM: this process's peak RSS. (ru_maxrss would not do: Linux carries it over fork and
    exec, so a child reports its parent's peak when that was higher.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(path: str, policy: str, capacity: int, engine: str) -> None:
    """Child: load the trace, run one policy, print one JSON line."""
    from kvscope.sim.simulate import simulate

    z = np.load(path, allow_pickle=True)
    meta = z["meta"].item()
    tr = Trace(
        meta["source"], meta["block_size"], meta["ids"], z["start"], z["end"], z["prompt"],
        z["output"], z["keys"], z["offsets"], meta["agents"], meta["workflows"], meta["prev"],
    )  # fmt: skip
    before = _rss_mb()
    t = time.perf_counter()
    res = simulate(tr, policy, capacity, engine=engine)
    wall = time.perf_counter() - t
    peak = _peak_mb()
    hit = float(res.cached_blocks.sum()) / max(int(tr.offsets[-1]), 1)
    print(json.dumps({"policy": policy, "engine": engine, "n": len(tr), "wall": wall,
                      "hit": hit, "peak_mb": peak, "before_mb": before}))  # fmt: skip


def save(tr: Trace, path: str) -> None:
    meta = {"source": tr.source, "block_size": tr.block_size, "ids": tr.request_ids,
            "agents": tr.agents, "workflows": tr.workflows, "prev": tr.previous_agents}  # fmt: skip
    np.savez(path, start=tr.start_s, end=tr.end_s, prompt=tr.prompt_tokens,
             output=tr.output_tokens, keys=tr.keys, offsets=tr.offsets,
             meta=np.array(meta, dtype=object))  # fmt: skip


def run(
    n: int, policies: list[str], capacity: int, block_size: int, engines: list[str]
) -> dict[tuple[str, str], float]:
    """Build the trace, run each (engine, policy) in a child, print a line each; wall seconds by
    (engine, policy). On "sglang" only the radix cache's policies run."""
    from kvscope.sim.caches.radix import RADIX_POLICIES

    t = time.perf_counter()
    tr = peer_trace(n, block_size)
    built = time.perf_counter() - t
    blocks = int(tr.offsets[-1])
    print(f"trace: {n} requests, {blocks} blocks, mean prompt "
          f"{tr.prompt_tokens.mean():.0f} tokens, built in {built:.2f} s; "
          f"capacity {capacity} blocks")  # fmt: skip
    walls: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "trace.npz")
        save(tr, path)
        del tr
        for engine in engines:
            for p in policies:
                if engine == "sglang" and p not in RADIX_POLICIES:
                    continue
                out = subprocess.run(
                    [sys.executable, __file__, "--worker", path, p, str(capacity), engine],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                r = json.loads(out.stdout.strip().splitlines()[-1])
                walls[engine, p] = r["wall"]
                print(f"  {engine:6s} {p:20s} {r['wall']:7.2f} s  {n / r['wall']:7.0f} req/s  "
                      f"hit {r['hit']:.3f}  peak RSS {r['peak_mb']:5.0f} MB "
                      f"({r['before_mb']:.0f} MB before simulate)")  # fmt: skip
    for (engine, p), w in walls.items():
        if p != "lru" and (engine, "lru") in walls:
            print(f"  {engine} {p} / lru wall time: {w / walls[engine, 'lru']:.2f}")
    return walls


def time_chain_keys(block_size: int, n: int = 2000) -> None:
    rng = np.random.default_rng(1)
    toks = [rng.integers(0, 50000, size=1500) for _ in range(n)]
    t = time.perf_counter()
    keys, _ = chain_keys(toks, block_size)
    dt = time.perf_counter() - t
    print(f"chain_keys on token ids: {n} prompts x 1500 tokens in {dt:.3f} s "
          f"({n / dt:.0f} prompts/s; {len(keys)} blocks)")  # fmt: skip


def write_traces(d: Path, n: int, tokens: int, block_size: int) -> tuple[Path, Path]:
    """A token-id trace of n requests, ~`tokens` prompt tokens in all (each prompt: a prefix
    shared by all, its workflow's growing context, a fresh suffix), and the same requests as a
    Mooncake trace; written with orjson."""
    import orjson

    from kvscope.sim.inputs.convert import mooncake_rows
    from kvscope.sim.inputs.sources import load_source

    rng = np.random.default_rng(2)
    per = max(tokens // n, 4)
    shared = rng.integers(0, 50_000, size=per // 4)
    tok_path, moon_path = d / "tokens.jsonl", d / "mooncake.jsonl"
    contexts: dict[int, np.ndarray] = {}
    with tok_path.open("wb") as f:
        for i in range(n):
            wf = i // 8
            ctx = contexts.setdefault(wf, rng.integers(0, 50_000, size=per // 2))
            step = (i % 8 + 1) * len(ctx) // 8
            suffix = rng.integers(0, 50_000, size=max(per - len(shared) - step, 1))
            ids = np.concatenate([shared, ctx[:step], suffix])
            row = {"request_id": f"r{i}", "timestamp": i * 10, "token_ids": ids,
                   "output_length": 64, "agent": f"a{i % 4}", "workflow": f"w{wf}"}  # fmt: skip
            f.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            contexts.pop(wf - 1, None)
    with moon_path.open("wb") as f:
        for row in mooncake_rows(load_source(tok_path, block_size)):
            f.write(orjson.dumps(row) + b"\n")
    return tok_path, moon_path


def load_worker(path: str, block_size: int) -> None:
    """Child: load_source(path), print one JSON line (seconds, peak RSS)."""
    from kvscope.sim.inputs.sources import load_source

    t, c = time.perf_counter(), time.process_time()
    source = load_source(Path(path), block_size)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_mb": _peak_mb(), "n": len(source.trace),
                      "tokens": int(source.trace.prompt_tokens.sum())}))  # fmt: skip


def time_loading(n: int, tokens: int, block_size: int, repeat: int = 3) -> None:
    with tempfile.TemporaryDirectory() as d:
        paths = write_traces(Path(d), n, tokens, block_size)
        for path in paths:
            mb = path.stat().st_size / 2**20
            for _ in range(repeat):
                out = subprocess.run(
                    [sys.executable, __file__, "--load-worker", str(path), str(block_size)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"load {path.name:14s} {mb:6.0f} MB, {r['n']} requests, {r['tokens']:,} "
                      f"tokens: {r['wall']:6.2f} s wall {r['cpu']:6.2f} s CPU  "
                      f"peak RSS {r['peak_mb']:5.0f} MB")  # fmt: skip


ANCHORS = ("kvlint==0.1.1", "prefixlens==0.1.0")
ANCHOR_SCRIPT = """
import json, sys, time
path, name, bs, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t, c = time.perf_counter(), time.process_time()
rows = [json.loads(line) for line in open(path)]
if name == "kvlint":
    from kvlint.sim.vllm_blocks import VLLMBlockSimulator
    sim = VLLMBlockSimulator(bs, cap)
    cached = sum(sim.feed_tokens(r["request_id"], r["token_ids"]).cached_tokens for r in rows)
else:
    from prefixlens.request import Request
    from prefixlens.simulator import RadixCacheSimulator
    sim = RadixCacheSimulator(bs, cap)
    cached = bs * sum(sim.process(Request(r["request_id"], tuple(r["token_ids"])))
                      .cached_prefix_blocks for r in rows)
peak = [int(x.split()[1]) / 1024 for x in open("/proc/self/status") if x.startswith("VmHWM")]
print(json.dumps({"cached": cached, "cpu": time.process_time() - c, "peak_mb": peak[0]}))
"""


def anchors_python() -> str:
    """The anchors' venv's python, made (and the anchors installed) on first use."""
    venv = Path(os.environ.get("ANCHORS_VENV", "~/.cache/kvscope-bench/anchors")).expanduser()
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_bare_env())
        pip = [str(python), "-m", "pip", "install", "-q", *ANCHORS]
        subprocess.run(pip, check=True, env=_bare_env())
    return str(python)


def _bare_env() -> dict[str, str]:
    """The environment without PYTHONPATH: the anchors never see kvscope's sources."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def zipf_trace(path: Path, n: int, seed: int = 5) -> Path:
    """n token-id requests, each one of 60 prefixes (300-1,500 tokens, Zipf-popular) plus a
    fresh suffix of 1-300 tokens, with outputs of 1-400 tokens."""
    import orjson

    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 50_000, size=int(rng.integers(300, 1500))) for _ in range(60)]
    pop = 1 / np.arange(1, 61)
    with path.open("wb") as f:
        for i in range(n):
            head = prefixes[rng.choice(60, p=pop / pop.sum())]
            ids = np.concatenate([head, rng.integers(0, 50_000, size=int(rng.integers(1, 300)))])
            row = {"request_id": f"r{i}", "timestamp": i, "token_ids": ids.tolist(),
                   "output_length": int(rng.integers(1, 400))}  # fmt: skip
            f.write(orjson.dumps(row) + b"\n")
    return path


def kvscope_worker(path: str, bs: int, cap: int, engine: str) -> None:
    """Child: kvscope replay --prompt-only of the trace, one JSON line."""
    from kvscope.sim.inputs.sources import load_source
    from kvscope.sim.simulate import simulate

    c = time.process_time()
    trace = load_source(Path(path), bs).trace
    order = "head-first" if engine == "vllm" else "tail-first"
    res = simulate(trace, "lru", cap, engine=engine, cache_outputs=False, in_request=order)
    print(json.dumps({"cached": int(res.cached_tokens.sum()), "cpu": time.process_time() - c,
                      "peak_mb": _peak_mb()}))  # fmt: skip


def compare_anchors(n: int, bs: int, capacities: list[int]) -> None:
    anchors = anchors_python()
    with tempfile.TemporaryDirectory() as d:
        path = zipf_trace(Path(d) / "t.jsonl", n)
        print(f"token-id trace: {n} requests, {path.stat().st_size / 2**20:.0f} MB, "
              f"block size {bs}; kvscope --prompt-only")  # fmt: skip

        def child(cmd: list[str]) -> dict:
            env = _bare_env() if cmd[0] == anchors else None
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
            return json.loads(out.strip().splitlines()[-1])

        for cap in capacities:
            args = [str(path), str(bs), str(cap)]
            pairs = (("kvlint", "vllm"), ("prefixlens", "sglang"))
            for anchor, engine in pairs:
                a = child([anchors, "-c", ANCHOR_SCRIPT, str(path), anchor, str(bs), str(cap)])
                k = child([sys.executable, __file__, "--kvscope-worker", *args, engine])
                print(f"  {cap:7d} blocks  {anchor:10s} {a['cached']:>12,} cached "
                      f"{a['cpu']:6.2f} s CPU {a['peak_mb']:5.0f} MB | kvscope {engine:6s} "
                      f"{k['cached']:>12,} ({k['cached'] / max(a['cached'], 1):.4f}x) "
                      f"{k['cpu']:6.2f} s CPU {k['peak_mb']:5.0f} MB; "
                      f"CPU {a['cpu'] / max(k['cpu'], 1e-9):.1f}x faster")  # fmt: skip


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--kvscope-worker":
        kvscope_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--limit":
        from replay_limit import main as limit_main

        limit_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--load-worker":
        load_worker(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--policies", default="lru,belady")
    ap.add_argument("--capacity-tokens", type=int, default=20480)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--engine", default="vllm", help="vllm, sglang or both: vllm,sglang")
    ap.add_argument("--check", action="store_true", help="25k, 50k and 100k: is it linear?")
    ap.add_argument("--load-tokens", type=int, help="time load_source on traces of ~N tokens")
    ap.add_argument("--anchors", action="store_true", help="against kvlint and prefixlens")
    ap.add_argument("--anchor-blocks", default="50,200,800,1600,100000")
    a = ap.parse_args()
    if a.anchors:
        compare_anchors(a.requests, a.block_size, [int(c) for c in a.anchor_blocks.split(",")])
        return
    if a.load_tokens:
        time_loading(a.requests, a.load_tokens, a.block_size)
        return
    cap = a.capacity_tokens // a.block_size
    pol = a.policies.split(",")
    time_chain_keys(a.block_size)
    sizes = (25_000, 50_000, 100_000) if a.check else (a.requests,)
    walls = [run(n, pol, cap, a.block_size, a.engine.split(",")) for n in sizes]
    if a.check:
        for key in walls[0]:
            w = [x[key] for x in walls]
            print(f"{key[0]} {key[1]}: wall per 1k requests at 25k / 50k / 100k: "
                  + " / ".join(f"{1000 * t / n:.3f} s" for t, n in zip(w, sizes, strict=True))
                  + f"; 100k / 25k = {w[2] / w[0]:.2f} (linear: 4)")  # fmt: skip


if __name__ == "__main__":
    main()
