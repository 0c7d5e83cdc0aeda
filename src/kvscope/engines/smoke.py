"""A short end-to-end check of a running engine: cache reuse, counters and KV events, measured."""

import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import httpx

from kvscope.engines.base import Endpoints, Engine
from kvscope.engines.detect import (
    fetch_metrics,
    list_models,
    stream_usage,
)
from kvscope.engines.kv_events import receive, replay, subscriber
from kvscope.records.kv_events import KvBatch

# ~1,000 tokens of shared context: what the PEER agents of one workflow have in common.
SHARED_CONTEXT = (
    "You are one agent of a four-agent team: Planner, Executor, Expresser, Reviewer.\n"
    "Shared document: quarterly ledger of a small company.\n"
    + "\n".join(
        f"Line {i}: account {1000 + i} moved {17 * i % 97}.{i % 10} thousand in Q{i % 4 + 1}."
        for i in range(48)
    )
)
QUESTIONS = ("Which account moved the most?", "Summarize quarter 2 in one sentence.")


@dataclass(frozen=True)
class Call:
    question: str
    prompt_tokens: int | None
    cached_tokens: int | None  # None: the engine did not report it
    seconds: float


@dataclass(frozen=True)
class SmokeResult:
    model: str
    calls: tuple[Call, ...]
    counters_before: dict[str, float | None]
    counters_after: dict[str, float | None]
    events: dict[str, int]  # KV event type -> count, for batches published during the check
    blocks: dict[str, int]  # KV event type -> blocks it names
    events_via_replay: int  # batches that came only through the replay socket

    def counter_delta(self, name: str) -> float | None:
        """`name`'s increase over the check. A counter the engine listed only after (SGLang lists a
        labelled counter from its first increment) counted 0 before, where the before-scrape
        itself was read (it holds some counter); never seen after: None."""
        a, b = self.counters_before.get(name), self.counters_after.get(name)
        read = any(v is not None for v in self.counters_before.values())
        if a is None and b is not None and read:
            a = 0.0
        return None if a is None or b is None else b - a


def run(engine: type[Engine], endpoints: Endpoints, nonce: str | None = None) -> SmokeResult:
    """Two requests that share a long system prompt; the second should reuse its KV blocks."""
    head = f"[check {nonce or time.time_ns()}]\n"  # fresh prefix: the first call is cold
    system = head + SHARED_CONTEXT
    with httpx.Client(timeout=300) as client:
        model = list_models(client, endpoints.base_url)[0]
        before = engine.counters(fetch_metrics(client, endpoints.metrics_url) or [])
        batches: list[KvBatch] = []
        started = time.time()
        calls = []
        listen = (
            subscriber(endpoints.kv_events, endpoints.kv_events_subscriber_binds)
            if endpoints.kv_events
            else nullcontext(None)
        )
        with listen as sock:
            time.sleep(0.5)
            for question in QUESTIONS:
                messages = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ]
                t0 = time.perf_counter()
                usage = stream_usage(client, endpoints.base_url, model, messages, max_tokens=16)
                calls.append(_call(question, usage, time.perf_counter() - t0))
            if sock is not None:
                batches = receive(sock, 3.0)
        via_replay = 0
        if endpoints.kv_events_replay:
            seen = {b.seq for b in batches}
            missed = [b for b in replay(endpoints.kv_events_replay) if b.seq not in seen]
            missed = [b for b in missed if b.ts_ns >= (started - 1) * 1e9]
            via_replay = len(missed)
            batches += missed
        after = engine.counters(fetch_metrics(client, endpoints.metrics_url) or [])
    events = [e for b in batches for e in b.events]
    types = Counter(_TYPES[e.kind] for e in events)
    blocks: Counter[str] = Counter()
    for e in events:
        blocks[_TYPES[e.kind]] += len(e.block_hashes)
    return SmokeResult(model, tuple(calls), before, after, dict(types), dict(blocks), via_replay)


_TYPES = {"stored": "BlockStored", "removed": "BlockRemoved", "cleared": "AllBlocksCleared"}


def _call(question: str, usage: dict[str, Any] | None, seconds: float) -> Call:
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Call(question, usage.get("prompt_tokens"), cached, seconds)
