"""Embedded engine start-up and footprint: prints numbers, asserts nothing.

    .venv/bin/python bench/engine_startup.py [--runs 3] [--kv-capacity-tokens 4096]

Per run: seconds to healthy, memory (RSS) of the whole engine process tree once healthy,
latency of a cold and a warm request sharing a ~1,000-token prefix, and seconds to stop.
"""

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psutil

from kvscope.config import EngineConfig
from kvscope.engines import make_engine
from kvscope.engines.runtime import start
from kvscope.engines.smoke import SHARED_CONTEXT


def tree_rss_mib(pid: int) -> float:
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20


def request_s(base: str, system: str) -> float:
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
        "max_tokens": 1,
    }
    t0 = time.perf_counter()
    httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300).raise_for_status()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kv-capacity-tokens", type=int, default=None)
    args = parser.parse_args()
    rows = []
    for run in range(1, args.runs + 1):
        cfg = EngineConfig(
            port=8190, kv_events_port=5690, kv_capacity_tokens=args.kv_capacity_tokens
        )
        with tempfile.TemporaryDirectory() as tmp:
            handle = start(make_engine(cfg), Path(tmp) / "engine.log")
            assert handle.process is not None and handle.startup_s is not None
            try:
                rss = tree_rss_mib(handle.process.pid)
                system = f"[{uuid.uuid4()}]\n{SHARED_CONTEXT}"
                cold = request_s(handle.endpoints.base_url, system)
                warm = request_s(handle.endpoints.base_url, system)
            finally:
                t0 = time.perf_counter()
                handle.stop()
                stop_s = time.perf_counter() - t0
        rows.append((handle.startup_s, rss, cold, warm, stop_s))
        print(
            f"run {run}: healthy {handle.startup_s:6.1f} s  rss {rss:7.0f} MiB  "
            f"cold {cold:5.2f} s  warm {warm:5.2f} s  stop {stop_s:4.1f} s",
            flush=True,
        )
    cols = list(zip(*rows, strict=True))
    names = ("healthy_s", "rss_mib", "cold_request_s", "warm_request_s", "stop_s")
    print(
        "median: "
        + "  ".join(f"{n} {statistics.median(c):.2f}" for n, c in zip(names, cols, strict=True))
    )


if __name__ == "__main__":
    main()
