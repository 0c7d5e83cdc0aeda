"""What makes the app's garbage collector run more often under kvscope: prints numbers, asserts
nothing.

    .venv/bin/python bench/load_gc.py [--calls 6000] [--workflows 100]
        [--without interceptor,tracker,jobs,reply-wrapper]

bench/load.py's app and stand-in engine, closed loop, bare and then inside `kvscope.profile()`,
each with a callback on the collector: young collections a call, full collections per 1,000
calls, and the objects each young-generation collection promotes (those in generations 0 and 1
when it starts, less those it frees), with their types' counts per call as kvscope changes them
(kvscope minus bare, largest first). A full collection is what puts a call in the p99 tail
(README, issue 32). `--without` takes parts of kvscope out, to attribute the difference (each a
measurement only; the run's rows are then incomplete or missing):
- interceptor: no call is intercepted (kvscope's session runs, the app's calls go out untouched);
- tracker: the LangChain callback handler is not attached (calls are not named);
- jobs: the background thread drops each call's end (no row written);
- reply-wrapper: the reply is not wrapped (the call ends at its headers, unmeasured).
"""

import argparse
import asyncio
import gc
import tempfile
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from load import Tally, console, drive, start_engine

import kvscope
from kvscope import capture

PARTS = ("interceptor", "tracker", "jobs", "reply-wrapper")


class Collections:
    """The collector's work while a load runs, per call."""

    def __init__(self) -> None:
        self.runs = Counter[int]()  # collections per generation
        self.freed = 0  # objects young collections freed
        self.garbage = 0  # objects any collection freed: garbage in reference cycles
        self.candidates = 0  # objects in generations 0 and 1 when a young collection started
        self.types = Counter[str]()

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "stop":
            self.runs[generation] += 1
            self.freed += info["collected"] if generation == 1 else 0
            self.garbage += info["collected"]
        elif generation == 1:
            young = gc.get_objects(0) + gc.get_objects(1)
            self.candidates += len(young)
            self.types.update(f"{type(o).__module__}.{type(o).__qualname__}" for o in young)

    def line(self, label: str, calls: int) -> str:
        return (f"{label:8s} {calls} calls: young collections {self.runs[0] / calls:.3f} a call, "
                f"full {1000 * self.runs[2] / calls:.2f} per 1,000, promoted "
                f"{(self.candidates - self.freed) / calls:.1f} objects a call, cyclic garbage "
                f"{self.garbage / calls:.1f} objects a call")  # fmt: skip


def measured(work: Coroutine[Any, Any, Tally]) -> tuple[Tally, Collections]:
    seen = Collections()
    gc.collect()
    gc.callbacks.append(seen)
    try:
        tally = asyncio.run(work)
    finally:
        gc.callbacks.remove(seen)
    return tally, seen


def take_out(parts: set[str]) -> None:
    """kvscope without `parts` (module doc), in this process."""
    from kvscope.probe import background, intercept, run_tracker

    if "interceptor" in parts:
        intercept.Interceptor.matches = lambda self, request: False  # type: ignore[method-assign]
    if "tracker" in parts:
        run_tracker._SLOT.get = lambda: None  # type: ignore[method-assign]
    if "jobs" in parts:
        background.Background._do = lambda self, job: None  # type: ignore[method-assign]
    if "reply-wrapper" in parts:

        def unwrapped(lib: object, response: object, call: intercept.Call) -> None:
            call.replied(response.status_code, response.headers)  # type: ignore[attr-defined]
            call.finish()

        intercept._observe = unwrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=6000)
    parser.add_argument("--workflows", type=int, default=100)
    parser.add_argument("--without", default="", help=f"comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--port", type=int, default=8124)
    args = parser.parse_args()
    parts = {p.strip() for p in args.without.split(",") if p.strip()}
    if parts - set(PARTS):
        raise SystemExit(f"--without: unknown {sorted(parts - set(PARTS))}; known: {PARTS}")
    engine = start_engine(args.port)
    url = f"http://127.0.0.1:{args.port}"
    try:
        work = drive(url + "/v1", "smollm2", args.workflows, 1e9, "bare", args.calls, engine.pid)
        bare, bare_gc = measured(work)
        console.print(bare_gc.line("bare", bare.sent))
        capture._chat_tokenizer = lambda *_: None  # an attached engine's folder is unknown
        take_out(parts)
        with tempfile.TemporaryDirectory() as tmp:
            store = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
            with kvscope.profile(name="gc", attach=url, runs_dir=tmp, traces=False,
                                 tracking_uri=store) as run:  # fmt: skip
                work = drive(run.base_url, run.model, args.workflows, 1e9, "kvscope", args.calls,
                             engine.pid)  # fmt: skip
                tally, seen = measured(work)
        label = "kvscope" + (f" without {', '.join(sorted(parts))}" if parts else "")
        console.print(seen.line(label, tally.sent))
        diff = Counter({t: seen.types[t] / tally.sent - bare_gc.types[t] / bare.sent
                        for t in set(seen.types) | set(bare_gc.types)})  # fmt: skip
        console.print("promoted a call, kvscope minus bare, by type:")
        for name, more in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15]:
            console.print(f"  {more:+7.2f}  {name}")
    finally:
        engine.terminate()
        engine.wait()


if __name__ == "__main__":
    main()
