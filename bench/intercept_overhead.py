"""What kvscope's interception costs an app per model call: prints numbers, asserts nothing.

    .venv/bin/python bench/intercept_overhead.py [--calls 300]

The engine is the stand-in that replays vLLM 0.32.0's recorded reply (tests/vllm_stub.py), so the
numbers are the client side alone: the OpenAI SDK's call with no kvscope, then the same call
intercepted (tags, usage chunk stripped, row written to a list), inside a LangGraph node (identity
from the run context), and with the prompt's token ids from the model's chat template and
tokenizer (the embedded model's, when installed). Streamed and non-streamed; median and p95
microseconds per call, and the difference to the plain call.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import httpx2  # noqa: E402
import openai  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from vllm_stub import Stub  # noqa: E402

from kvscope.config import EngineConfig  # noqa: E402
from kvscope.engines.vllm import VllmEngine  # noqa: E402
from kvscope.paths import cache_dir  # noqa: E402
from kvscope.probe.instrument import PromptInstrument  # noqa: E402
from kvscope.probe.intercept import Interceptor  # noqa: E402
from kvscope.probe.tokens import ChatTokenizer  # noqa: E402
from kvscope.probe.wire import CallContext  # noqa: E402

BASE = "http://engine:8000"
MESSAGES = [
    {"role": "system", "content": "You are the planner. " * 40},
    {"role": "user", "content": "What was the 2023 revenue growth? Show the calculation."},
]


def timed(call: Callable[[], Any], n: int) -> list[float]:
    call()  # warm
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    n = parser.parse_args().calls
    client = openai.OpenAI(
        base_url=f"{BASE}/v1", api_key="x",
        http_client=httpx2.Client(transport=Stub().transport(httpx2)),
    )  # fmt: skip

    def streamed() -> None:
        for _ in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
            pass

    def whole() -> None:
        client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    class S(TypedDict):
        n: int

    def in_graph(call: Callable[[], None]) -> Callable[[], None]:
        g = StateGraph(S)
        g.add_node("planner", lambda s: (call(), {"n": 1})[1])
        g.add_edge(START, "planner")
        g.add_edge("planner", END)
        graph = g.compile()
        return lambda: graph.invoke({"n": 0}, {"configurable": {"thread_id": "t"}})

    rows: list[Any] = []
    model_dir = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    chat = ChatTokenizer.from_model_dir(model_dir) if model_dir.is_dir() else None
    plain_ctx = CallContext("b", "e", "h", "bench", None, "m", None, rows.append)
    tok_ctx = CallContext("b", "e", "h", "bench", None, "m", None, rows.append,
                          instrument=PromptInstrument(chat, None))  # fmt: skip
    engine = VllmEngine(EngineConfig())
    print(f"{n} calls each; microseconds per call (client side; stand-in engine)")
    print(f"{'case':<58} {'p50':>8} {'p95':>8} {'+p50':>8}")
    for label, call in (("streamed", streamed), ("non-streamed", whole)):
        graph_plain = timed(in_graph(call), n)
        cases = [
            ("plain SDK call", None, call),
            ("plain, in a LangGraph node", None, in_graph(call)),
        ]
        cases += [("intercepted", plain_ctx, call),
                  ("intercepted, in a LangGraph node", plain_ctx, in_graph(call))]  # fmt: skip
        if chat is not None:
            cases.append(("intercepted + prompt token ids, in a node", tok_ctx, in_graph(call)))
        base = None
        for name, ctx, fn in cases:
            if fn is None:
                samples = graph_plain
            elif ctx is None:
                samples = timed(fn, n)
            else:
                with Interceptor(engine, BASE, ctx):
                    samples = timed(fn, n)
            p50 = statistics.median(samples)
            p95 = statistics.quantiles(samples, n=20)[18]
            ref = base if "node" not in name else statistics.median(graph_plain)
            base = p50 if name == "plain SDK call" else base
            extra = "" if ctx is None else f"{p50 - (ref or p50):>8.0f}"
            print(f"{label + ': ' + name:<58} {p50:>8.0f} {p95:>8.0f} {extra}")
    if chat is None:
        print(f"(no model at {model_dir}: the prompt-token case was skipped)")


if __name__ == "__main__":
    main()
