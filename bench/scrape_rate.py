"""How many /metrics samples a second the scraper keeps while its machine is busy. Prints numbers.

Serves a recorded vLLM /metrics text with `python -m http.server` (a process of its own), then,
for the in-process thread (`Sampler`) and the child process kvscope runs (`MetricsScraper`), samples
it for a while under two kinds of load: CPU hogs started in this process's session (as an engine
and a workload would keep the cores busy), and bursts in which this process holds its own GIL.

    .venv/bin/python bench/scrape_rate.py --seconds 10 --hogs 2
"""

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from kvscope.collect.metrics import Sampler
from kvscope.collect.scraper import MetricsScraper
from kvscope.engines.vllm import VllmEngine

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32.0" / "metrics.prom"


def serve(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    (root / "metrics").write_text(FIXTURE.read_text())
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", str(root), "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    port = proc.stdout.readline().decode().split("port ")[1].split()[0]  # "Serving HTTP on ..."
    url = f"http://127.0.0.1:{port}/metrics"
    httpx.get(url).raise_for_status()
    return proc, url


def hold_gil(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(30_000_000))  # a C loop: the GIL is held throughout (~0.4 s), back to back


def measure(kind: type, url: str, interval_s: float, seconds: float, gil: bool) -> dict:
    scraper = kind(VllmEngine, url, "bench", interval_s=interval_s)
    scraper.start()
    stop = threading.Event()
    if gil:
        threading.Thread(target=hold_gil, args=(stop,), daemon=True).start()
    time.sleep(seconds)
    stop.set()
    summary = scraper.stop()
    times = [t for t, _ in scraper.kvscope_series().get("kv_usage", [])]
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(times)]
    return {
        "samples/s": summary.samples_per_s if summary else 0.0,
        "skipped": summary.skipped_ticks if summary else None,
        "p50 ms": statistics.median(gaps_ms) if gaps_ms else None,
        "max ms": max(gaps_ms) if gaps_ms else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--hogs", type=int, default=2, help="CPU-bound processes beside it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        server, url = serve(Path(root))
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)
        ]
        try:
            print(f"interval {args.interval} s ({1 / args.interval:.1f}/s asked), "
                  f"{args.seconds:g} s each, {args.hogs} CPU hogs beside it")  # fmt: skip
            print(f"{'scraper':<16}{'load':<22}{'samples/s':>10}{'skipped':>9}"
                  f"{'p50 ms':>9}{'max ms':>9}")  # fmt: skip
            for kind, gil in itertools.product((Sampler, MetricsScraper), (False, True)):
                r = measure(kind, url, args.interval, args.seconds, gil)
                load = "hogs + GIL held" if gil else "hogs"
                print(f"{kind.__name__:<16}{load:<22}{r['samples/s']:>10.2f}{r['skipped']:>9}"
                      f"{r['p50 ms']:>9.0f}{r['max ms']:>9.0f}")  # fmt: skip
        finally:
            for proc in (*hogs, server):
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
