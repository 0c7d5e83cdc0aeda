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
BLOCKS = 10
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
    print(f"{n} calls each, in {BLOCKS} interleaved blocks; microseconds per call (client side)")
    print(f"{'case':<52} {'p50':>7} {'p95':>7} {'plain p50':>10} {'added':>7}")
    for label, call in (("streamed", streamed), ("non-streamed", whole)):
        node = in_graph(call)
        cases = [("intercepted", plain_ctx, call, call),
                 ("intercepted, in a LangGraph node", plain_ctx, node, node)]  # fmt: skip
        if chat is not None:
            cases.append(("intercepted + prompt token ids, in a node", tok_ctx, node, node))
        for name, ctx, plain_fn, fn in cases:
            plain, profiled = [], []
            for _ in range(BLOCKS):  # alternate, so that drift hits both alike
                plain += timed(plain_fn, n // BLOCKS)
                with Interceptor(engine, BASE, ctx):
                    profiled += timed(fn, n // BLOCKS)
            p50, base = statistics.median(profiled), statistics.median(plain)
            p95 = statistics.quantiles(profiled, n=20)[18]
            print(f"{label + ': ' + name:<52} {p50:>7.0f} {p95:>7.0f} {base:>10.0f} "
                  f"{p50 - base:>7.0f}")  # fmt: skip
    if chat is None:
        print(f"(no model at {model_dir}: the prompt-token case was skipped)")


if __name__ == "__main__":
    main()
