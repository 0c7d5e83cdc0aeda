"""kvscope under load, the profiler being the bottleneck: prints numbers, asserts nothing.

    .venv/bin/python bench/load.py [--workflows 200] [--seconds 300] [--no-tokenize]
    .venv/bin/python bench/load.py --workflows 100 500 --calls 100000   # scale: closed loop
    .venv/bin/python bench/load.py --workflows 100 --seconds 40 --bare-seconds 40 --rounds 3
    .venv/bin/python bench/load.py --workflows 100 --rate 200   # latency at a load the loop bears

The engine is a stand-in that answers at once (bench/standin_engine.py: vLLM 0.32.0's recorded
replies over real HTTP, from a process of its own), so every cost measured is the app's and the
profiler's; a stand-in is used because the point here is kvscope's own cost, not an engine's.
The app is a 4-node LangGraph graph (planner -> executor -> expresser -> reviewer, each node one
streamed chat call with openai.AsyncOpenAI, as kvscope's own apps make it); `--workflows` of
them run at once on one event loop, each invoking its graph again and again (thread `load-<i>`,
one turn per invocation) until the time is up. Calls are counted where they are made.

1. Latency, one workflow at a time: per-call latency p50 / p99 of the bare client, the same
   intercepted (kvscope's Interceptor writing rows, payloads and prompt ids to a run directory's
   streams, as a capture session does) and intercepted with Level-3 tokenization (the chat
   template and tokenizer of the embedded model render each prompt's token ids), in alternating
   blocks so that drift hits all alike; the difference to bare is what the probe adds per call.
2. Load without kvscope (`--bare-seconds`): requests/s and per-call latency of the bare client,
   then the same with a tracing SDK instead (`--peer`, default where installed:
   bench/tracing_peer.py, OpenInference's LangChain + OpenAI instrumentations on OpenTelemetry's
   batch span processor), the same columns, and kvscope's added loop CPU over the SDK's.
3. Load with `kvscope.profile(attach=...)` for `--seconds`: requests/s, per-call latency, rows
   in the finalized request table vs calls sent, MLflow traces written (the run's own audit) vs
   graph invocations, how long the session's close, finalize (tables, status, analysis) and
   publish (report, MLflow params, metrics and traces) took, where prompts were tokenized
   (run.json's capture.prompt_tokenization: off the loop, or on it when the queue was full), and
   the profiled process's RSS sampled every 2 s:
   peak, and its slope over the second half of the load (flat = no growth per call).

Closed loop (the default), each workflow sends its next call as soon as its last is answered: the
event loop is saturated, so a call's latency is the workflows over the throughput, and latency
added mirrors throughput lost. `--rate R` offers R calls a second in all instead (an open-loop
schedule the workflows share; each call's latency counts from its slot): at a rate the bare app
bears, latency added is what the profiler adds to a call, queueing on the loop included.

Each load phase also reports CPU per call: the event loop thread's own (time.thread_time in it:
the app plus what kvscope does on its hot path), the whole process's (kvscope's threads
included) and the stand-in engine's, and the garbage collector's pauses per call, full
collections apart (a process that holds more objects pauses longer in each: `kvscope.profile`
brings MLflow's modules), and the event-loop turns a call spans: a call waits a whole turn,
behind every ready task, at each await of something not ready, so in a saturated loop the turns
a call spans are what its latency is made of, and one more turn a call is ~+25% latency.
`--calls N` runs both load phases closed-loop to N calls instead of for a time (`--bare-calls
M`: the bare phase to M); `--workflows` takes several counts (e.g. 100 500), each its pair of
load phases.

An attached engine's model folder is unknown to kvscope, so no tokenizer would be used: with
`--tokenize` (default) the session is handed the embedded model's, as a launched vLLM's would
be. The recorded reply's prompt_tokens (592) differs from the rendered prompt's, so rows are
flagged prompt_token_mismatch; the tokenization cost is paid all the same.
"""

import argparse
import asyncio
import gc
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import httpx2
import openai
import psutil
import tracing_peer
from langgraph.graph import END, START, StateGraph
from rich.console import Console
from rich.table import Table

import kvscope
from kvscope import capture
from kvscope.config import EngineConfig
from kvscope.engines.attach import AttachEngine
from kvscope.paths import cache_dir
from kvscope.probe.intercept import Interceptor
from kvscope.probe.streams import CallStreams
from kvscope.probe.tokens import ChatTokenizer
from kvscope.probe.wire import RunInfo
from kvscope.records.run_dir import read_run_json
from kvscope.workload.chat import stream_chat

HERE = Path(__file__).resolve().parent
AGENTS = ("planner", "executor", "expresser", "reviewer")
SYSTEM = {a: f"You are the {a} of a finance desk. " + "Keep the books. " * 40 for a in AGENTS}
MAX_TOKENS = 8
MIB = 2**20
console = Console(width=130)


@dataclass
class Tally:
    """What the app did, counted at the call site."""

    sent: int = 0
    failed: int = 0
    invocations: int = 0
    latency_ms: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)  # event-loop turns each call spanned
    wall_s: float = 0.0
    loop_cpu_s: float = 0.0  # the event loop thread's own CPU time
    process_cpu_s: float = 0.0  # every thread of the process
    engine_cpu_s: float = 0.0  # the stand-in engine's process
    gc_s: float = 0.0  # the cyclic garbage collector's pauses, any thread
    gc_full_s: float = 0.0  # of which full (oldest generation) collections
    gc_full_n: int = 0  # how many full collections

    def per_call_ms(self, seconds: float) -> float:
        return seconds * 1e3 / self.sent if self.sent else float("nan")


LOOP_TURNS = [0]  # turns of the running event loop


def count_turns(loop: asyncio.AbstractEventLoop) -> None:
    """Count the loop's turns in LOOP_TURNS (its private `_run_once`, wrapped on this loop
    only: a measurement). A call that awaits something not ready waits a whole turn: in a
    saturated loop, behind every ready task, so turns a call are what its latency is made of."""
    if getattr(loop, "_counted", False):
        return
    run_once = loop._run_once  # type: ignore[attr-defined]

    def counted() -> None:
        LOOP_TURNS[0] += 1
        run_once()

    loop._run_once = counted  # type: ignore[attr-defined]
    loop._counted = True  # type: ignore[attr-defined]


class State(TypedDict):
    notes: list[str]


class Pacer:
    """Calls offered at `rate` a second in all (`--rate`: one schedule the workflows share, open
    loop): each call waits for its slot, and its latency counts from the slot, so a loop that
    falls behind shows in the latency, not in fewer calls (no coordinated omission)."""

    def __init__(self, rate: float) -> None:
        self.gap, self.next = 1.0 / rate, time.perf_counter()

    async def slot(self) -> float:
        at, self.next = self.next, self.next + self.gap
        if (wait := at - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        return at


def graph(client: openai.AsyncOpenAI, model: str, tally: Tally, pacer: Pacer | None) -> Any:
    """The app: four nodes, each one streamed chat call (each at its slot, with a pacer)."""

    def node(agent: str) -> Callable[[State], Awaitable[State]]:
        async def call(state: State) -> State:
            task = "What was the 2023 revenue growth? " + " ".join(state["notes"])
            messages = [{"role": "system", "content": SYSTEM[agent]},
                        {"role": "user", "content": task}]  # fmt: skip
            t0 = await pacer.slot() if pacer else time.perf_counter()
            tally.sent += 1
            n0 = LOOP_TURNS[0]
            reply = await stream_chat(client, model, messages, MAX_TOKENS)
            tally.latency_ms.append((time.perf_counter() - t0) * 1e3)
            tally.turns.append(LOOP_TURNS[0] - n0)
            tally.failed += reply.content is None
            return {"notes": [*state["notes"], (reply.content or "")[:40]]}

        return call

    g = StateGraph(State)
    for agent in AGENTS:
        g.add_node(agent, node(agent))
    for a, b in zip((START, *AGENTS), (*AGENTS, END), strict=True):
        g.add_edge(a, b)
    return g.compile()


def client_for(base_url: str, workflows: int) -> openai.AsyncOpenAI:
    limits = httpx2.Limits(max_connections=workflows + 16, max_keepalive_connections=workflows + 16)
    return openai.AsyncOpenAI(
        base_url=base_url, api_key="x", max_retries=0,
        http_client=openai.DefaultAsyncHttpx2Client(limits=limits),
    )  # fmt: skip


async def drive(
    base_url: str, model: str, workflows: int, seconds: float, label: str,
    calls: int | None = None, engine_pid: int | None = None, rate: float | None = None,
) -> Tally:  # fmt: skip
    """`workflows` graphs at once, each invoked again and again until `seconds` are up (or, with
    `calls`, until that many calls were started); `rate`: calls paced to that many a second."""
    tally, client = Tally(), client_for(base_url, workflows)
    app = graph(client, model, tally, Pacer(rate) if rate else None)
    deadline = time.monotonic() + seconds

    def more() -> bool:
        return tally.sent < calls if calls is not None else time.monotonic() < deadline

    async def worker(i: int) -> None:
        while more():
            await app.ainvoke({"notes": []}, {"configurable": {"thread_id": f"load-{i}"}})
            tally.invocations += 1

    async def progress() -> None:
        start, last = time.monotonic(), 0
        while True:
            await asyncio.sleep(30)
            rss = psutil.Process().memory_info().rss / MIB
            console.print(f"  {label}: {time.monotonic() - start:4.0f} s, {tally.sent} calls "
                          f"({(tally.sent - last) / 30:.0f}/s), RSS {rss:.0f} MiB")  # fmt: skip
            last = tally.sent

    engine = psutil.Process(engine_pid) if engine_pid else None
    e0 = sum(engine.cpu_times()[:2]) if engine else 0.0
    gc_started = [0.0]

    def gc_pause(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            pause = time.perf_counter() - gc_started[0]
            tally.gc_s += pause
            full = info.get("generation") == 2
            tally.gc_full_s += pause if full else 0.0
            tally.gc_full_n += full

    gc.callbacks.append(gc_pause)
    count_turns(asyncio.get_running_loop())
    t0, c0, p0 = time.monotonic(), time.thread_time(), time.process_time()
    ticker = asyncio.create_task(progress())
    await asyncio.gather(*(worker(i) for i in range(workflows)))
    ticker.cancel()
    tally.wall_s, tally.loop_cpu_s = time.monotonic() - t0, time.thread_time() - c0
    tally.process_cpu_s = time.process_time() - p0
    tally.engine_cpu_s = sum(engine.cpu_times()[:2]) - e0 if engine else 0.0
    gc.callbacks.remove(gc_pause)
    await client.close()
    return tally


class RssSampler:
    """This process's RSS every `every_s` seconds, from a thread (the event loop is saturated)."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s, self.samples = every_s, [(time.monotonic(), self.rss())]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def rss() -> float:
        return psutil.Process().memory_info().rss / MIB

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append((time.monotonic(), self.rss()))

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic(), self.rss()))

    def mark(self) -> float:
        """A sample now (a load shorter than `every_s` still has its start and end); its time."""
        self.samples.append((time.monotonic(), self.rss()))
        return self.samples[-1][0]

    def between(self, t0: float, t1: float) -> list[tuple[float, float]]:
        return [(t, m) for t, m in self.samples if t0 <= t <= t1]


def slope_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares MiB per minute of the samples' second half."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2:
        return float("nan")
    return statistics.linear_regression([t for t, _ in half], [m for _, m in half]).slope * 60


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def latency_phase(base_url: str, model: str, calls: int, chat: ChatTokenizer | None) -> dict:
    """Per-call latency of one workflow at a time: bare, intercepted, intercepted + tokenizer."""
    engine = AttachEngine(EngineConfig(kind="attach", url=base_url.removesuffix("/v1")))
    info = RunInfo("bench", "bench", "h", "load", None, model, None)
    out: dict[str, list[float]] = {"bare": [], "kvscope": [], "kvscope + tokenize": []}
    with tempfile.TemporaryDirectory() as tmp:
        streams = CallStreams(Path(tmp), tokens=True, payloads=True)
        contexts = {"kvscope": streams.context(info, None, False)}
        if chat is not None:
            contexts["kvscope + tokenize"] = streams.context(info, chat, False)

        async def block(case: str, n: int) -> None:
            tally = Tally()
            client = client_for(base_url, 1)
            app = graph(client, model, tally, None)
            while tally.sent < n:
                await app.ainvoke({"notes": []}, {"configurable": {"thread_id": "lat"}})
            await client.close()
            out[case] += tally.latency_ms[4:]  # the first invocation warms the connection

        per_block = max(calls // 10, 8)
        for _ in range(10):
            asyncio.run(block("bare", per_block))
            for case, ctx in contexts.items():
                with Interceptor(engine, base_url, ctx, on_tool=streams.tool):
                    asyncio.run(block(case, per_block))
        streams.close()
    return {k: v for k, v in out.items() if v}


def start_engine(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(HERE / "standin_engine.py"), "--port", str(port)],
                            stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        raise SystemExit("the stand-in engine did not start")
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, nargs="+", default=[200])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--bare-seconds", type=float, default=60)
    parser.add_argument("--calls", type=int, help="closed loop: each load phase sends this many")
    parser.add_argument("--bare-calls", type=int, help="the bare phase's calls (default: --calls)")
    parser.add_argument("--latency-calls", type=int, default=400)
    parser.add_argument("--rate", type=float,
                        help="calls offered a second in all, paced (open loop; default: none, "
                             "each workflow's next call right after its last)")  # fmt: skip
    parser.add_argument("--tokenize", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--runs-dir", help="keep the profiled run here (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="bare, peer and kvscope phases this many times in turn")  # fmt: skip
    peer_help = f"also the app traced by {tracing_peer.NAME} (tracing_peer.py)"
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help=peer_help)  # fmt: skip
    args = parser.parse_args()
    model_dir = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    chat = ChatTokenizer.from_model_dir(model_dir) if model_dir.is_dir() else None
    if chat is None:
        console.print(f"no tokenizer at {model_dir}: no tokenization measured")
    url = f"http://127.0.0.1:{args.port}"
    engine = start_engine(args.port)
    try:
        if args.latency_calls:
            console.print(f"latency: {args.latency_calls} calls per case, one workflow at a time")
            print_latency(latency_phase(url + "/v1", "smollm2", args.latency_calls, chat))
        for workflows in args.workflows:
            rounds = []
            for r in range(args.rounds):
                bare_calls = args.bare_calls or args.calls
                span = f"{bare_calls} calls" if bare_calls else f"{args.bare_seconds:.0f} s"
                console.print(f"round {r + 1}: bare load: {workflows} workflows, {span}")
                work = drive(url + "/v1", "smollm2", workflows, args.bare_seconds, "bare",
                             bare_calls, engine.pid, args.rate)  # fmt: skip
                bare = asyncio.run(work)
                peer = traced_load(args, workflows, url, bare_calls, engine.pid)
                tok = chat if args.tokenize else None
                rounds.append(profiled(args, workflows, url, tok, bare, peer, engine.pid))
            if len(rounds) > 1:
                print_rounds(workflows, rounds)
    finally:
        engine.terminate()
        engine.wait()


def traced_load(args: argparse.Namespace, workflows: int, url: str, calls: int | None,
                engine_pid: int) -> tuple[Tally, int] | None:  # fmt: skip
    """The same load with the tracing SDK on (its tally, spans it wrote); None: not run."""
    if not args.peer:
        return None
    if missing := tracing_peer.available():
        console.print(f"{tracing_peer.NAME} not installed ({missing}): not compared")
        return None
    span = f"{calls} calls" if calls else f"{args.bare_seconds:.0f} s"
    console.print(f"{tracing_peer.NAME} load: {workflows} workflows, {span}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "spans.jsonl"
        with tracing_peer.traced(out):
            work = drive(url + "/v1", "smollm2", workflows, args.bare_seconds, "traced", calls,
                         engine_pid, args.rate)  # fmt: skip
            tally = asyncio.run(work)
        return tally, tracing_peer.spans_written(out)


def profiled(args: argparse.Namespace, workflows: int, url: str, chat: ChatTokenizer | None,
             bare: Tally, peer: tuple[Tally, int] | None,
             engine_pid: int) -> list[Tally]:  # fmt: skip
    tokens = "with" if chat else "without"
    span = f"{args.calls} calls" if args.calls else f"{args.seconds:.0f} s"
    console.print(f"kvscope load: {workflows} workflows, {span}, {tokens} tokenization")
    capture._chat_tokenizer = lambda *_: chat  # an attached engine's folder is unknown
    began = time.monotonic()
    stages: dict[str, float] = {}

    def stage(text: str) -> None:
        stages.setdefault(text, time.monotonic())
        console.print(f"  {time.monotonic() - began:5.0f} s  kvscope: {text}")

    with tempfile.TemporaryDirectory() as tmp, RssSampler() as rss:
        runs_dir = args.runs_dir or tmp
        with kvscope.profile(name="load", attach=url, runs_dir=runs_dir, traces=True,
                             on_stage=stage) as run:  # fmt: skip
            t0 = rss.mark()
            work = drive(run.base_url, run.model, workflows, args.seconds, "kvscope", args.calls,
                         engine_pid, args.rate)  # fmt: skip
            tally = asyncio.run(work)
            t1 = rss.mark()
            load = rss.between(t0, t1)
            console.print(f"  load done: {tally.sent / tally.wall_s:.0f} requests/s, RSS peak "
                          f"{max(m for _, m in load):.0f} MiB, slope "
                          f"{slope_per_min(load):+.2f} MiB/min")  # fmt: skip
        t2 = time.monotonic()
        rows = run.requests().select(["status", "workflow_run_id", "agent_id"]).to_pylist()
        outcome = run.outcome
        captured = read_run_json(run.run_dir).get("capture") or {}
        tokenized = captured.get("prompt_tokenization") or {}
        background = captured.get("background") or {}
    assert outcome is not None
    fin = stages.get("writing the request table", t2)
    pub = stages.get("writing report.html", t2)
    per_invocation = Counter(r["workflow_run_id"] for r in rows)
    audit = outcome.audit
    traces = f"{audit.written} / {audit.expected}" if audit else str(outcome.mlflow_error)
    phases = [bare, tally] if peer is None else [bare, peer[0], tally]

    def row(what: str, values: list[float], fmt: str, added: str) -> tuple[str, ...]:
        """`values`: bare's, the peer's (if run) and kvscope's; each after bare with its added."""
        cells = [fmt.format(values[0])]
        for v in values[1:]:
            ratio = v / values[0] if values[0] else float("nan")  # {1}: the ratio, {2}: - 1
            cells += [fmt.format(v), added.format(v - values[0], ratio, ratio - 1)]
        return (what, *cells)

    def per_call(what: str, field: str) -> tuple[str, ...]:
        return row(what, [t.per_call_ms(getattr(t, field)) for t in phases], "{:.2f}", "{:+.2f}")

    def latency(q: float) -> tuple[str, ...]:
        values = [pct(t.latency_ms, q) for t in phases]
        return row(f"call latency p{q * 100:.0f} (ms)", values, "{:.1f}", "{2:+.0%}")

    def ours(what: str, value: str) -> tuple[str, ...]:
        return (what, "", *([""] * 2 * (len(phases) - 2)), value, "")

    rates = [t.sent / t.wall_s for t in phases]
    offered = [row("  offered (--rate)", [args.rate or 0] * len(phases), "{:.0f}", "")]
    offered = offered if args.rate else []
    full_per_1000 = [1e3 * t.gc_full_n / max(t.sent, 1) for t in phases]
    full_ms = [1e3 * t.gc_full_s / max(t.gc_full_n, 1) for t in phases]
    ok = sum(r["status"] == "ok" for r in rows)
    turns = [statistics.fmean(t.turns or [0]) for t in phases]
    lines = [
        row("seconds", [t.wall_s for t in phases], "{:.0f}", ""),
        row("requests/s sustained", rates, "{:.0f}", "{1:.0%} of bare"),
        *offered,
        row("ms of the loop per call (1 / rate)", [1e3 / r for r in rates], "{:.2f}", "{:+.2f}"),
        per_call("loop thread CPU per call (ms)", "loop_cpu_s"),
        per_call("process CPU per call, all threads (ms)", "process_cpu_s"),
        per_call("stand-in engine CPU per call (ms)", "engine_cpu_s"),
        per_call("GC pauses per call (ms)", "gc_s"),
        per_call("  of which full collections (ms)", "gc_full_s"),
        row("  full collections per 1,000 calls", full_per_1000, "{:.2f}", "{:+.2f}"),
        row("  ms per full collection", full_ms, "{:.1f}", "{:+.1f}"),
        latency(0.5),
        latency(0.99),
        row("event-loop turns a call (mean)", turns, "{:.2f}", "{:+.2f}"),
        row("calls sent", [t.sent for t in phases], "{:.0f}", ""),
        row("calls failed", [t.failed for t in phases], "{:.0f}", ""),
        row("graph invocations", [t.invocations for t in phases], "{:.0f}", ""),
        ours("rows written / ok", f"{len(rows)} / {ok}"),
        ours("rows lost (sent - written)", f"{tally.sent - len(rows)}"),
        ours("rows named by agent", f"{sum(r['agent_id'] in AGENTS for r in rows)}"),
        ours("prompts tokenized: process / thread / app's",
             " / ".join(str(tokenized.get(k, 0)) for k in ("process", "worker", "app"))),
        ours("call ends: background thread / app's (queue full)",
             f"{background.get('queued', '?')} / {background.get('inline', '?')}"),
        ours("invocations with their 4 rows", f"{sum(n == 4 for n in per_invocation.values())}"),
        ours("traces written / expected (audit)", traces),
        ours("close: streams, collectors (s)", f"{fin - t1:.1f}"),
        ours("finalize: tables, status, analysis (s)", f"{pub - fin:.1f}"),
        ours("publish: report, MLflow, traces (s)", f"{t2 - pub:.1f}"),
        ours("RSS at start of load (MiB)", f"{load[0][1]:.0f}"),
        ours("RSS peak during load (MiB)", f"{max(m for _, m in load):.0f}"),
        ours("RSS slope, 2nd half of load (MiB/min)", f"{slope_per_min(load):+.2f}"),
        ours("RSS peak incl. finalize + publish (MiB)", f"{max(m for _, m in rss.samples):.0f}"),
    ]  # fmt: skip
    if peer is not None:
        lines.insert(-12, ("spans written by the tracing SDK", "", str(peer[1]), "", "", ""))
    paced = f", {args.rate:.0f} calls/s offered" if args.rate else ", closed loop"
    res = Table(title=f"{workflows} workflows at once{paced}, stand-in engine")
    res.add_column("", no_wrap=True)
    names = ["bare client", f"kvscope ({tokens} tokenization)"]
    if peer is not None:
        names.insert(1, tracing_peer.NAME)
    res.add_column(names[0], justify="right")
    for name in names[1:]:
        res.add_column(name, justify="right")
        res.add_column("added", justify="right")
    for line in lines:
        res.add_row(*line)
    console.print(res)
    if peer is not None:
        loop = [t.per_call_ms(t.loop_cpu_s) for t in phases]
        console.print(f"loop CPU added per call: kvscope {loop[2] - loop[0]:+.2f} ms, "
                      f"{tracing_peer.NAME} {loop[1] - loop[0]:+.2f} ms: kvscope / peer = "
                      f"{(loop[2] - loop[0]) / (loop[1] - loop[0]):.2f}")  # fmt: skip
    return phases


def print_rounds(workflows: int, rounds: list[list[Tally]]) -> None:
    """Each round's phases side by side, and the medians: the bare client drifts between
    phases on a shared machine more than kvscope's own cost, so one round can mislead."""
    names = ["bare", tracing_peer.NAME, "kvscope"] if len(rounds[0]) == 3 else ["bare", "kvscope"]
    table = Table(title=f"{workflows} workflows: {len(rounds)} rounds, phases in turn")
    table.add_column("round", justify="right")
    for name in names:
        table.add_column(f"{name} req/s", justify="right")
    for name in names[1:]:
        table.add_column(f"{name} loop CPU added (ms)", justify="right")
        table.add_column(f"{name} p99 added", justify="right")
        table.add_column(f"{name} loop turns added", justify="right")
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    added: dict[str, list[float]] = {n: [] for n in names[1:]}
    p99_added: dict[str, list[float]] = {n: [] for n in names[1:]}
    for i, phases in enumerate(rounds, 1):
        rates = [t.sent / t.wall_s for t in phases]
        loop = [t.per_call_ms(t.loop_cpu_s) for t in phases]
        p99 = [pct(t.latency_ms, 0.99) for t in phases]
        turns = [statistics.fmean(t.turns or [0]) for t in phases]
        cells = [f"{r:.0f}" for r in rates[:1]]
        cells += [f"{r:.0f} ({r / rates[0]:.0%})" for r in rates[1:]]
        for k, name in enumerate(names[1:], 1):
            r, c, q = rates[k], loop[k], p99[k]
            cells += [f"{c - loop[0]:+.2f}", f"{q / p99[0] - 1:+.0%}"]
            cells.append(f"{turns[k] - turns[0]:+.2f}")
            ratios[name].append(r / rates[0])
            added[name].append(c - loop[0])
            p99_added[name].append(q / p99[0] - 1)
        table.add_row(str(i), *cells)
    console.print(table)
    for name in names[1:]:
        console.print(f"{name}: median {statistics.median(ratios[name]):.0%} of bare, "
                      f"loop CPU added median {statistics.median(added[name]):+.2f} ms "
                      f"(range {min(added[name]):+.2f} .. {max(added[name]):+.2f}), p99 added "
                      f"median {statistics.median(p99_added[name]):+.0%}")  # fmt: skip


def print_latency(latency: dict[str, list[float]]) -> None:
    table = Table(title="per-call latency, one workflow at a time (ms)")
    for col in ("case", "calls", "p50", "p99", "added p50", "added p99"):
        table.add_column(col, justify="right")
    base50, base99 = pct(latency["bare"], 0.5), pct(latency["bare"], 0.99)
    for case, values in latency.items():
        p50, p99 = pct(values, 0.5), pct(values, 0.99)
        table.add_row(case, str(len(values)), f"{p50:.2f}", f"{p99:.2f}",
                      f"{p50 - base50:+.2f}", f"{p99 - base99:+.2f}")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
