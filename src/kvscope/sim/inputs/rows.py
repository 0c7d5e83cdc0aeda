"""A trace file's requests as read, in file order, a chunk at a time (`Read`s): gathered into a
Trace (`gathered`), or replayed as they come (sim/streamed.py); their prompts' token ids hashed
into block keys as they are read (Hasher)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvscope.errors import KvscopeError
from kvscope.records import blockkey
from kvscope.sim.caches.compiled import worth_compiling
from kvscope.sim.trace import LineNames, Trace

Label = str | None


@dataclass(frozen=True)
class Columns:
    """One chunk's requests: times in ms (end >= start), token counts, identities.
    `previous`: the line's previous_agent, False where the line does not give one."""

    ids: Sequence[str]  # a list, or LineNames
    start_ms: np.ndarray  # float64
    end_ms: np.ndarray  # float64
    prompt: np.ndarray  # int64
    output: np.ndarray  # int64
    agents: list[Label]
    workflows: list[Label]
    previous: list[Label | bool]


@dataclass
class Rows:
    """Parsed JSONL requests, in file order, a chunk's Columns at a time, before sorting."""

    chunks: list[Columns] = field(default_factory=list)
    count: int = 0

    def add(self, columns: Columns) -> None:
        self.chunks.append(columns)
        self.count += len(columns.ids)

    def trace(self, source: Path, block_size: int, keys: KeyChunks) -> Trace:
        if not self.count:
            raise KvscopeError(f"{source} is empty: no requests to replay")
        c = self.chunks

        def flat(name: str) -> np.ndarray:
            return np.concatenate([getattr(x, name) for x in c])

        def joined(name: str) -> list:
            return [v for x in c for v in getattr(x, name)]

        start = flat("start_ms")
        order = np.argsort(start, kind="stable")
        pick = order.tolist()
        agents, workflows, given = joined("agents"), joined("workflows"), joined("previous")
        agents, workflows = [agents[i] for i in pick], [workflows[i] for i in pick]
        derived = _previous_agents(agents, workflows)
        previous = [
            d if given[i] is False else given[i] for d, i in zip(derived, pick, strict=True)
        ]
        keys_flat, counts = keys.sorted(order)
        offsets = np.zeros(len(pick) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return Trace(
            source=str(source),
            block_size=block_size,
            request_ids=_request_ids([x.ids for x in c], order),
            start_s=start[order] / 1e3,
            end_s=flat("end_ms")[order] / 1e3,
            prompt_tokens=flat("prompt")[order],
            output_tokens=flat("output")[order],
            keys=keys_flat,
            offsets=offsets,
            agents=tuple(agents),
            workflows=tuple(workflows),
            previous_agents=tuple(previous),  # type: ignore[arg-type]
        )


def _request_ids(chunks: list[Sequence[str]], order: np.ndarray) -> Sequence[str]:
    """The chunks' request ids in `order`: LineNames where every chunk's are, else a tuple."""
    lines = [ids.lines for ids in chunks if isinstance(ids, LineNames)]
    if len(lines) == len(chunks):
        return LineNames(np.concatenate(lines)[order])
    ids = [v for x in chunks for v in x]
    return tuple(ids[i] for i in order.tolist())


def _previous_agents(agents: list[Label], workflows: list[Label]) -> list[Label]:
    """Each request's previous agent: the agent of the previous request of its workflow."""
    last: dict[Label, Label] = {}
    out: list[Label] = []
    for agent, workflow in zip(agents, workflows, strict=True):
        out.append(last.get(workflow))
        last[workflow] = agent
    return out


Read = tuple[Columns, np.ndarray, np.ndarray]  # a chunk's columns, keys flat, keys per request


def gathered(source: Path, block_size: int, reads: Iterable[Read]) -> Trace:
    """A reader's chunks (file order) gathered into a Trace, sorted by start."""
    rows, keys = Rows(), KeyChunks()
    for columns, flat, counts in reads:
        rows.add(columns)
        keys.add_flat(flat, counts)
    return rows.trace(source, block_size, keys)


class KeyChunks:
    """Requests' block keys in file order, gathered a few thousand requests at a time into
    flat uint64 chunks: the per-line arrays are freed as the file is read (their memory is
    reused for the next lines), not held until the end."""

    CHUNK = 4096  # requests per chunk

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.pending: list[np.ndarray] = []
        self.counts: list[int] = []

    def add(self, keys: np.ndarray) -> None:
        self.pending.append(keys.astype(np.uint64, copy=False))  # int64 and uint64 mix as floats
        self.counts.append(len(keys))
        if len(self.pending) >= self.CHUNK:
            self.flush()

    def add_flat(self, flat: np.ndarray, counts: np.ndarray) -> None:
        """Several requests' keys at once (`counts[i]` of them for the i-th)."""
        self.flush()
        self.chunks.append(flat.astype(np.uint64, copy=False))
        self.counts += counts.tolist()

    def flush(self) -> None:
        if self.pending:
            self.chunks.append(np.concatenate(self.pending).astype(np.uint64, copy=False))
            self.pending = []

    def sorted(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys, counts) with requests in `order` (indices in file order)."""
        self.flush()
        chunks, self.chunks = self.chunks, []
        flat = chunks[0] if len(chunks) == 1 else np.concatenate(chunks or [np.zeros(0)])
        del chunks
        flat = flat.astype(np.uint64, copy=False)
        counts = np.array(self.counts, dtype=np.int64)
        if len(order) and (order[1:] > order[:-1]).all():  # already in order: no copy
            return flat, counts
        starts = np.zeros(len(counts), dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        picked = counts[order]
        out = np.empty(len(flat), dtype=np.uint64)
        at = 0
        for lo in range(0, len(order), self.CHUNK):  # gathered a chunk of requests at a time
            part, size = order[lo : lo + self.CHUNK], picked[lo : lo + self.CHUNK]
            n = int(size.sum())
            shift = np.repeat(starts[part] - (np.cumsum(size) - size), size)
            out[at : at + n] = flat[shift + np.arange(n)]
            at += n
        return out, picked


class Hasher:
    """Prompts' token ids in, their block keys out (records.blockkey's), a group of prompts at a
    time: by numpy, and once the trace has shown as many blocks as make compiled code pay
    (compiled.worth_compiling: the pool will run compiled too) by chain_kernel's compiled loop,
    the same keys ~5x faster."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = 0  # keys made so far

    def keys_of(self, flat: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys flat, keys per prompt) of prompts laid end to end in `flat`, `counts[i]`
        tokens for the i-th."""
        if worth_compiling(self.blocks + len(flat) // self.block_size):
            from kvscope.sim.inputs.chain_kernel import keys_of

            keys, per_prompt = keys_of(flat, counts, self.block_size)
        else:
            flat = flat.astype(np.int64, copy=False)  # numpy's arithmetic: not in uint16
            keys, _, offsets = blockkey.prompt_blocks(Flat(flat, counts), self.block_size, False)
            per_prompt = np.diff(offsets)
        self.blocks += len(keys)
        return keys, per_prompt


class Flat:
    """Prompts laid end to end as blockkey.Batches."""

    def __init__(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.flat, self.lengths = flat, lengths
        self.starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.starts[1:])

    def concat(self, lo: int, hi: int) -> np.ndarray:
        return self.flat[self.starts[lo] : self.starts[hi]]
