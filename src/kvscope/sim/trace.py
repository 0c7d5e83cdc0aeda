"""The trace the simulator replays: one row per request, prompts as chained block keys.

A block key identifies a full block of `block_size` prompt tokens *and its whole prefix*: two
requests share their k-th key (from 0) exactly when their first k + 1 blocks are token for token
the same (the chaining vLLM and SGLang hash with). Keys come from token ids (`chain_keys`:
records.blockkey's keys, the ones a finalized run's blocks have) or are given (a Mooncake
trace's `hash_ids`, kept as given). Blocks are stored flat: request i's keys are
`keys[offsets[i]:offsets[i + 1]]` (CSR), so a 100k-request trace is a few numpy arrays.

Timing: `start_s` is when the engine began the request (its blocks are taken), `end_s` when
it finished (its blocks become evictable); both in seconds on one clock. `end_s` equal to
`start_s` (a trace without durations) releases a request before the next one starts.
`prefill_end_s`: when the engine had computed the request's prompt (its prefill forward pass
ended), from which its prompt pages are in SGLang's tree for other requests to match; a run's
first-token time (sent + TTFT, sim/inputs/sources.py). None (every trace without timing:
Mooncake, token ids), NaN or a value at or before `start_s`: at the start (the radix replay's
rule before prefill timing); one after `end_s` counts as `end_s`. The vLLM pool ignores it.
A value that was not measured is NaN (floats) or None (labels), never 0.
`priorities`: the SGLang `priority` each call was sent with (eviction hints, probe/hints.py),
replayed by the sglang `priority` policy (sim/simulate.py).
`request_ids`: each request's id; a trace file that names none has them as `LineNames` ("line-N"
for line N, made when read: a number a request, not a string).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

import numpy as np

from kvscope.records import blockkey
from kvscope.records.agents import transition_label


def chain_keys(
    token_ids: Sequence[Sequence[int]] | Sequence[np.ndarray], block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Chained keys of every full block of every prompt: (keys uint64, offsets int64), request
    i's keys at keys[offsets[i]:offsets[i + 1]]. They are records.blockkey's keys (the ones
    finalize gives the run's blocks), so a replay's keys and a finalized run's compare."""
    keys, _, offsets = blockkey.prompt_blocks(token_ids, block_size, hashes=False)
    return keys, offsets


def line_name(n: int) -> str:
    """The id of the request on line `n` of a trace file that names it none."""
    return f"line-{n}"


class LineNames(Sequence[str]):
    """The ids of requests a trace file names none for: "line-N" for the request on line N,
    made when read (at 100k requests, ~6 MB of strings not kept). Equal to any sequence of the
    same strings."""

    __slots__ = ("lines",)

    def __init__(self, lines: np.ndarray) -> None:
        self.lines = np.asarray(lines, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lines)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> LineNames: ...
    def __getitem__(self, i: int | slice) -> str | LineNames:
        if isinstance(i, slice):
            return LineNames(self.lines[i])
        return line_name(int(self.lines[i]))

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, LineNames):
            return bool(np.array_equal(self.lines, other.lines))
        if isinstance(other, Sequence) and not isinstance(other, str):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LineNames({len(self)} lines)"


@dataclass(frozen=True)
class Trace:
    """A request trace in block form (see the module docstring for the contract)."""

    source: str  # a path or a description
    block_size: int
    request_ids: Sequence[str]  # a tuple, or LineNames
    start_s: np.ndarray  # float64
    end_s: np.ndarray  # float64, >= start_s
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    keys: np.ndarray  # uint64, chained block keys of the full prompt blocks, flat
    offsets: np.ndarray  # int64, len n + 1
    agents: tuple[str | None, ...]
    workflows: tuple[str | None, ...]
    previous_agents: tuple[str | None, ...]
    measured_cached_tokens: np.ndarray | None = None  # float64, NaN: not measured; None: no engine
    capacity_tokens: int | None = None  # the run's KV capacity
    engine: str | None = None  # "vllm" | "sglang": the engine the trace was recorded on
    # int64: the engine priority each call carried (0: none, as SGLang reads it); None: the
    # source records no such column (traces, runs before it) or no call carried one
    priorities: np.ndarray | None = None
    # float64, same clock as start_s: when the prompt became matchable (see the module doc);
    # None: at the start
    prefill_end_s: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.request_ids)

    def prefill_ends(self) -> np.ndarray:
        """prefill_end_s within [start_s, end_s] (start_s where None or NaN)."""
        start, end = np.asarray(self.start_s, float), np.asarray(self.end_s, float)
        if self.prefill_end_s is None:
            return start.copy()
        pe = np.asarray(self.prefill_end_s, float)
        return np.maximum(np.minimum(np.where(np.isnan(pe), start, pe), end), start)

    def blocks_of(self, i: int) -> np.ndarray:
        return self.keys[self.offsets[i] : self.offsets[i + 1]]

    def transition(self, i: int) -> str | None:
        """ "previous agent -> agent" (records.agents.transition_label); None without an agent."""
        agent = self.agents[i]
        return None if agent is None else transition_label(self.previous_agents[i], agent)


def prompt_only(trace: Trace) -> Trace:
    """`trace` as a cache that holds prompts only sees it (`simulate(cache_outputs=False)`): each
    request takes its prompt's full blocks and nothing else, its partial last block and its
    output no cache space; a lookup still hits at most (prompt - 1) // block_size blocks.

    As lengths: output 0, and a prompt with a partial last block cut to its full blocks plus one
    token, so that ceil((prompt + output - 1) / block_size) (the blocks a request takes, in both
    caches) is prompt // block_size and (prompt - 1) // block_size (the hit limit) is unchanged.
    Summaries are made over the original trace (its prompt tokens)."""
    cut = prompt_only_lengths(trace.prompt_tokens, trace.block_size)
    return replace(trace, prompt_tokens=cut, output_tokens=np.zeros_like(cut))


def prompt_only_lengths(prompt: np.ndarray, block_size: int) -> np.ndarray:
    """`prompt_only`'s prompt lengths: a partial last block cut to one token."""
    prompt = np.asarray(prompt, dtype=np.int64)
    part = prompt % block_size
    return np.where(part > 0, prompt - part + 1, prompt)
