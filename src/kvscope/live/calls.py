"""The calls a live replay sends: each captured call's exact prompt, output length and identity.

`live_calls(source, path)` turns a loaded Source (sim/inputs/sources.py) into `LiveCall`s, in the
trace's order:

- a run directory: the prompt token ids the run captured (records.tokens), the recorded
  completion tokens, agent, workflow, previous agent and turn (the request table's turn_id);
  `start_s` is when the call was sent (start_ns), not when the engine scheduled it.
- a token-id trace: the line's `token_ids` (the file is read again: the Source keeps only keys).
- a Mooncake trace: synthetic token ids expanded deterministically from the hash ids: block
  `h` becomes `block_size` ids drawn by an RNG seeded with `h`, so two requests share a prefix
  exactly up to their first differing hash id, at the same block boundaries; the ids of a
  partial last block are seeded by the request's position (a partial block is never shared).

Traces carry no turn: a call's turn is the agent's visit in its workflow (its calls so far + 1).
`cold=True` (the no-reuse counterfactual) overwrites each prompt's first `block_size` tokens with
ids unique to the call: its first block, hence (hashes chain) every block, is its own, while the
prompt keeps its length, so prefill work matches and only reuse differs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.errors import KvscopeError
from kvscope.records.run_dir import RunDir
from kvscope.sim.inputs.sources import Source

# Synthetic ids stay inside any current model's vocabulary and clear of the low special ids.
SYNTHETIC_LOW, SYNTHETIC_HIGH = 1_000, 32_000
_COLD_SEED = 0x636F6C64  # "cold"
_TAIL_SEED = 0x7461696C  # "tail"


@dataclass(frozen=True)
class LiveCall:
    """One call to send: its prompt ids (or recorded chat messages), how many tokens to decode,
    and the identity to tag."""

    index: int
    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    agent: str | None
    workflow: str | None
    previous_agent: str | None
    turn: int | None
    start_s: float
    end_s: float
    recorded_cached: float | None = None  # the source engine's cached tokens (None: not known)
    messages: tuple[dict[str, Any], ...] | None = None  # a chat call (prompt_ids then empty)
    recorded_prompt: int | None = None  # a chat call's recorded prompt tokens

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's tokens: its ids, or a chat call's recorded count."""
        return self.recorded_prompt if self.messages is not None else len(self.prompt_ids)


def block_tokens(hash_id: int, block_size: int) -> np.ndarray:
    """The synthetic token ids of Mooncake block `hash_id` (the same ids for the same id)."""
    rng = np.random.default_rng(int(hash_id))
    return rng.integers(SYNTHETIC_LOW, SYNTHETIC_HIGH, size=block_size, dtype=np.int64)


def mooncake_prompt(hash_ids: Sequence[int], length: int, block_size: int, index: int) -> list[int]:
    """A Mooncake request's `length` synthetic ids: its full blocks from their hash ids, then a
    partial block unique to the request."""
    full = length // block_size
    parts = [block_tokens(int(h), block_size) for h in hash_ids[:full]]
    tail = length - full * block_size
    if tail:
        rng = np.random.default_rng([_TAIL_SEED, index])
        parts.append(rng.integers(SYNTHETIC_LOW, SYNTHETIC_HIGH, size=tail, dtype=np.int64))
    return [int(t) for t in np.concatenate(parts)] if parts else []


def cold_prompt(ids: Sequence[int], index: int, block_size: int) -> tuple[int, ...]:
    """`ids` with its first `block_size` tokens replaced by ids unique to call `index`."""
    n = min(block_size, len(ids))
    rng = np.random.default_rng([_COLD_SEED, index])
    head = rng.integers(SYNTHETIC_LOW, SYNTHETIC_HIGH, size=n, dtype=np.int64)
    return tuple(int(t) for t in head) + tuple(int(t) for t in ids[n:])


def live_calls(source: Source, path: Path, *, cold: bool = False) -> list[LiveCall]:
    """The calls to send, in the trace's order (see the module doc)."""
    trace = source.trace
    if source.kind == "run":
        assert source.run is not None
        prompts = _run_prompts(source.run, trace.request_ids)
        turns, sent = _run_rows(source.run, trace.request_ids)
    elif source.kind == "tokens":
        prompts = _trace_prompts(path, trace.request_ids)
        turns, sent = _visits(trace.agents, trace.workflows), None
    elif source.kind == "mooncake":
        bs = trace.block_size
        prompts = [
            mooncake_prompt(
                [int(k) for k in trace.keys[trace.offsets[i] : trace.offsets[i + 1]]],
                int(trace.prompt_tokens[i]),
                bs,
                i,
            )
            for i in range(len(trace))
        ]
        turns, sent = _visits(trace.agents, trace.workflows), None
    else:
        raise KvscopeError(f"--live cannot replay a {source.kind!r} source")
    calls = []
    for i, ids in enumerate(prompts):
        if not ids:
            raise KvscopeError(f"{path}: request {trace.request_ids[i]} has an empty prompt")
        prompt = cold_prompt(ids, i, trace.block_size) if cold else tuple(int(t) for t in ids)
        calls.append(
            LiveCall(
                index=i,
                request_id=trace.request_ids[i],
                prompt_ids=prompt,
                max_tokens=max(int(trace.output_tokens[i]), 1),
                agent=trace.agents[i],
                workflow=trace.workflows[i],
                previous_agent=trace.previous_agents[i],
                turn=turns[i],
                start_s=float(trace.start_s[i] if sent is None else sent[i]),
                end_s=float(trace.end_s[i]),
                recorded_cached=_recorded(trace.measured_cached_tokens, i),
            )
        )
    return calls


def _recorded(measured: np.ndarray | None, i: int) -> float | None:
    if measured is None or math.isnan(measured[i]):
        return None
    return float(measured[i])


def _run_prompts(run: RunDir, request_ids: Sequence[str]) -> list[Sequence[int]]:
    tokens = run.tokens
    missing = [r for r in request_ids if r not in tokens]
    if missing:
        raise KvscopeError(f"{run.path}: no prompt token ids for request {missing[0]}")
    return [tokens[r].tolist() for r in request_ids]


def _run_rows(run: RunDir, request_ids: Sequence[str]) -> tuple[list[int | None], list[float]]:
    """Each call's turn and when it was sent (seconds): pacing keeps the app's gaps between a
    call's end and the next call's sending, not the engine's queueing before it scheduled one."""
    cols = ["request_uuid", "turn_id", "start_ns"]
    rows = {r["request_uuid"]: r for r in run.requests.select(cols).to_pylist()}
    return [rows[r]["turn_id"] for r in request_ids], [
        rows[r]["start_ns"] / 1e9 for r in request_ids
    ]


def _trace_prompts(path: Path, request_ids: Sequence[str]) -> list[Sequence[int]]:
    by_id: dict[str, list[int]] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                by_id[str(row["request_id"])] = row["token_ids"]
    return [by_id[r] for r in request_ids]


def _visits(agents: Sequence[str | None], workflows: Sequence[str | None]) -> list[int | None]:
    """Each call's visit of its agent in its workflow, from 1 (None without an agent)."""
    seen: dict[tuple[str | None, str], int] = {}
    out: list[int | None] = []
    for agent, workflow in zip(agents, workflows, strict=True):
        if agent is None:
            out.append(None)
            continue
        seen[(workflow, agent)] = seen.get((workflow, agent), 0) + 1
        out.append(seen[(workflow, agent)])
    return out


def limit_workflows(calls: list[LiveCall], n: int | None) -> list[LiveCall]:
    """Only the calls of the first `n` workflows (by first call), reindexed; None: all."""
    if n is None:
        return calls
    if n <= 0:
        raise KvscopeError(f"--limit-workflows must be positive, got {n}")
    order: dict[object, None] = {}
    for c in calls:
        order.setdefault(_workflow_key(c), None)
    chosen = set(list(order)[:n])
    picked = [c for c in calls if _workflow_key(c) in chosen]
    return [replace(c, index=i) for i, c in enumerate(picked)]


def _workflow_key(call: LiveCall) -> object:
    return call.workflow if call.workflow is not None else ("no-workflow", call.request_id)
