"""CPU engine speed per dtype and CPU ISA: prints numbers, asserts nothing.

    .venv/bin/python bench/engine_startup.py [--engine vllm|sglang] [--dtype auto float32 bfloat16]
        [--isa native avx2] [--runs 1] [--env VLLM_CPU_OMP_THREADS_BIND=nobind ...]

--engine: the embedded vLLM CPU (default) or SGLang's CPU engine, both as kvscope launches them.

For each dtype x ISA (x run): seconds to healthy, memory (RSS) of the engine's process tree once
healthy, cold prefill tokens/s (a ~1,000-token prompt never seen before, one output token),
warm request seconds (the same prompt again: served from the prefix cache), decode ms per output
token (64 tokens with ignore_eos, after the first), and seconds to stop. `--isa avx2` caps oneDNN
and ATen at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2): an AVX-512 machine then
behaves like an AVX2-only one, bf16 emulated. `--env` adds engine environment variables (the
launch's own, e.g. thread binding) to compare settings.
"""

import argparse
import itertools
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil

from kvscope.config import EngineConfig
from kvscope.engines import make_engine
from kvscope.engines.cpu import read_cpu
from kvscope.engines.runtime import start
from kvscope.engines.smoke import SHARED_CONTEXT

ISA_CAPS = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
DECODE_TOKENS = 64


def tree_rss_mib(pid: int) -> float:
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20


def chat(base: str, system: str, max_tokens: int) -> tuple[float, list[float], dict[str, Any]]:
    """(seconds to first token, arrival times of the later tokens, usage) of one streamed call."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first, later, usage = None, [], {}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                now = time.perf_counter() - t0
                if first is None:
                    first = now
                else:
                    later.append(now)
    assert first is not None, "no token streamed"
    return first, later, usage


def measure(kind: str, dtype: str, isa: str, env: dict[str, str]) -> dict[str, float]:
    cfg = EngineConfig(kind=kind, port=8190, kv_events_port=5690, dtype=dtype,  # type: ignore[arg-type]
                       env={**ISA_CAPS[isa], **env})  # fmt: skip
    engine = make_engine(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        handle = start(engine, Path(tmp) / "engine.log")
        assert handle.process is not None and handle.startup_s is not None
        try:
            base = handle.endpoints.base_url
            rss = tree_rss_mib(handle.process.pid)
            chat(base, f"[{uuid.uuid4()}] warm-up", 2)  # first-call costs off the numbers
            system = f"[{uuid.uuid4()}]\n{SHARED_CONTEXT}"
            cold, _, usage = chat(base, system, 1)
            warm, _, _ = chat(base, system, 1)
            _, later, _ = chat(base, f"[{uuid.uuid4()}] Count to one hundred.", DECODE_TOKENS)
            rss = max(rss, tree_rss_mib(handle.process.pid))
        finally:
            t0 = time.perf_counter()
            handle.stop()
            stop_s = time.perf_counter() - t0
    gaps = [b - a for a, b in itertools.pairwise(later)]
    return {
        "healthy_s": handle.startup_s,
        "rss_mib": rss,
        "prompt_tokens": float(usage.get("prompt_tokens", 0)),
        "cold_s": cold,
        "prefill_tok_s": usage.get("prompt_tokens", 0) / cold,
        "warm_s": warm,
        "decode_ms_tok": 1000 * statistics.median(gaps) if gaps else float("nan"),
        "stop_s": stop_s,
        "dtype_launched": engine.dtype_choice().dtype,  # type: ignore[dict-item]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    parser.add_argument("--dtype", nargs="+", default=["auto"])
    parser.add_argument("--isa", nargs="+", default=["native"], choices=sorted(ISA_CAPS))
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--env", nargs="*", default=[], help="KEY=VALUE for the engine")
    args = parser.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    cpu = read_cpu()
    print(f"CPU: {cpu.model}, {cpu.logical_cores} logical cores, flags {', '.join(cpu.flags)}")
    print(f"engine: {args.engine}")
    if env:
        print(f"engine env: {env}")
    cols = ("healthy_s", "rss_mib", "prompt_tokens", "cold_s", "prefill_tok_s", "warm_s",
            "decode_ms_tok", "stop_s")  # fmt: skip
    print(f"{'isa':7} {'dtype':9} {'run':>3} " + " ".join(f"{c:>13}" for c in cols))
    for isa in args.isa:
        for dtype in args.dtype:
            rows = []
            for run in range(1, args.runs + 1):
                row = measure(args.engine, dtype, isa, env)
                rows.append(row)
                label = f"{dtype}->{row['dtype_launched']}" if dtype == "auto" else dtype
                print(
                    f"{isa:7} {label:9} {run:>3} " + " ".join(f"{row[c]:13.2f}" for c in cols),
                    flush=True,
                )
            if args.runs > 1:
                med = {c: statistics.median(r[c] for r in rows) for c in cols}  # type: ignore[misc]
                print(f"{isa:7} {dtype:9} med " + " ".join(f"{med[c]:13.2f}" for c in cols))


if __name__ == "__main__":
    main()
