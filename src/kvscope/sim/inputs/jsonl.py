"""The two JSONL trace formats (sim/inputs/sources.py describes them) read into a Trace.

Lines are parsed by orjson; id lists become numpy arrays in one call each and are checked whole
(dtype, minimum), never token by token in Python. A token-id line's `token_ids` written compact
(digits between single commas, as orjson and json.dumps(separators=(",", ":")) write them) is
read by numpy straight from the line's bytes (`lifted_ids`), no Python int per token, and so is
a Mooncake line's compact `hash_ids`; any other form goes through orjson and the checks. A
token-id trace's prompts are hashed into block keys a batch of about `blockkey.BATCH_TOKENS`
tokens at a time while the file is read, so only the keys (one per block) stay in memory, not
the token ids.

What is refused, each as a KvscopeError naming the file, the line and the field: a line that is
not a JSON object; a missing field or one of the wrong type; a negative length; an id that is
not a non-negative integer (a fraction, a negative number, a string, true/false); a Mooncake
line whose hash_ids cannot be blocks of --block-size tokens: a prompt of `input_length` tokens
has ceil(input_length / block_size) blocks, the last partial one (a trace may leave its id
out), so fewer ids than full blocks or more ids than blocks is a block size other than the
trace's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from kvscope.errors import KvscopeError
from kvscope.records.blockkey import BATCH_TOKENS
from kvscope.sim.trace import Trace, chain_keys


def lines(
    path: Path, lift: str | None = None, dtype: type = np.int64
) -> Iterator[tuple[int, dict[str, Any], bytes]]:
    """(line number from 1, object, the line) per non-blank line; a line that is not a JSON
    object fails. `lift`: a field holding a list of ids, read by `lifted_ids` straight into
    an array of `dtype` where it can be (row[lift] is that array then), not as Python ints."""
    key = None if lift is None else b'"' + lift.encode() + b'":['
    with path.open("rb", buffering=1 << 20) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            ids, rest = lifted_ids(line, key, dtype) if key else (None, line)
            try:
                row = orjson.loads(rest)
            except orjson.JSONDecodeError as err:
                raise KvscopeError(f"{path}:{n}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise KvscopeError(f"{path}:{n}: not a JSON object")
            if ids is not None:
                if row.get(lift) != []:  # not where it seemed: read the whole line instead
                    row = orjson.loads(line)
                else:
                    row[lift] = ids  # type: ignore[index]
            yield n, row, line


def lifted_ids(line: bytes, key: bytes, dtype: type = np.int64) -> tuple[np.ndarray | None, bytes]:
    """(the ids of the list that follows `key` (`"name":[`) as `dtype` (int64 or uint64), the
    line with the list emptied) when that list is compact decimal integers (digits between
    single commas) below dtype's maximum; else (None, line): the caller parses it whole (and
    refuses what is wrong)."""
    a = line.find(key)
    if a < 0:
        return None, line
    a += len(key)
    b = line.find(b"]", a)
    text = line[a:b]
    if b < 0 or text.translate(None, b"0123456789,"):
        return None, line
    if not text:
        ids = np.zeros(0, dtype=dtype)
    elif b",," in text or text[:1] == b"," or text[-1:] == b",":
        return None, line
    else:
        ids = np.fromstring(text, dtype=dtype, sep=",")  # C strtoll/strtoull: saturates
        if len(ids) != text.count(b",") + 1 or (len(ids) and ids.max() == np.iinfo(dtype).max):
            return None, line
    return ids, line[:a] + line[b:]


def field_of(
    path: Path, n: int, row: dict[str, Any], name: str, kind: type | tuple[type, ...]
) -> Any:
    if name not in row or row[name] is None:
        raise KvscopeError(f"{path}:{n}: missing field {name!r}")
    value = row[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise KvscopeError(f"{path}:{n}: field {name!r} has the wrong type ({value!r:.40})")
    return value


def length_of(path: Path, n: int, row: dict[str, Any], name: str) -> int:
    """A token count: an integer, at least 0."""
    value = int(field_of(path, n, row, name, int))
    if value < 0:
        raise KvscopeError(f"{path}:{n}: field {name!r} is negative ({value})")
    return value


def _ms(path: Path, n: int, row: dict[str, Any], name: str, default: float) -> float:
    if row.get(name) is None:
        return default
    return float(field_of(path, n, row, name, (int, float)))


def ids_of(path: Path, n: int, row: dict[str, Any], name: str, line: bytes) -> np.ndarray:
    """Field `name`, a list of integers from 0 to 2**64 - 1, as an int64 array (uint64 when an id
    is 2**63 or more), checked whole: the dtype numpy infers and the minimum. `line`: the raw
    line (numpy reads true as 1: a line with a true or false in it is checked id by id)."""
    if isinstance(row.get(name), np.ndarray):  # lifted by `lines`: checked already
        return row[name]
    values = field_of(path, n, row, name, list)
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.array(values)
    except (ValueError, OverflowError, TypeError):  # ragged lists
        return _checked(path, n, name, values)
    if arr.dtype.kind == "f" and arr.ndim == 1 and set(map(type, values)) == {int}:
        # ids beyond 2**63 (numpy infers float64, lossy): exact as uint64, checked whole
        try:
            return np.array(values, dtype=np.uint64)
        except OverflowError:  # negative or beyond 64 bits: _checked names the id
            return _checked(path, n, name, values)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or b"true" in line or b"false" in line:
        return _checked(path, n, name, values)
    if arr.dtype.kind == "i" and arr.min() < 0:
        return _checked(path, n, name, values)
    return arr


def _checked(path: Path, n: int, name: str, values: list[Any]) -> np.ndarray:
    """`values` as uint64, checked id by id: the KvscopeError for the first that is not an
    integer from 0 to 2**64 - 1."""
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
            raise KvscopeError(
                f"{path}:{n}: field {name!r} holds {_what(v)} ({v!r:.40} at position {k}): "
                "ids are integers from 0 to 2**64 - 1"
            )
    return np.array(values, dtype=np.uint64)


def _what(v: Any) -> str:
    """What a refused id is (orjson reads an integer beyond 64 bits as a float)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return "a negative id" if v < 0 else "an id beyond 64 bits"
    if isinstance(v, float):
        if not v.is_integer():
            return "a fractional id"
        if abs(v) >= 2.0**64:
            return "an id beyond 64 bits"
    return "a non-integer id"


def _previous_agents(agents: list[str | None], workflows: list[str | None]) -> list[str | None]:
    """Each request's previous agent: the agent of the previous request of its workflow."""
    last: dict[str | None, str | None] = {}
    out: list[str | None] = []
    for agent, workflow in zip(agents, workflows, strict=True):
        out.append(last.get(workflow))
        last[workflow] = agent
    return out


@dataclass
class Rows:
    """Parsed JSONL requests, in file order, before sorting into a Trace."""

    ids: list[str] = field(default_factory=list)
    start_ms: list[float] = field(default_factory=list)
    end_ms: list[float] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    agents: list[str | None] = field(default_factory=list)
    workflows: list[str | None] = field(default_factory=list)
    previous: list[str | bool | None] = field(default_factory=list)  # False: not given

    def add(self, path: Path, n: int, row: dict[str, Any], rid: str, start: float) -> None:
        self.ids.append(rid)
        self.start_ms.append(start)
        self.end_ms.append(max(_ms(path, n, row, "end_timestamp", start), start))
        self.agents.append(row.get("agent"))
        self.workflows.append(row.get("workflow"))
        self.previous.append(row.get("previous_agent", False))

    def trace(self, source: Path, block_size: int, keys: KeyChunks) -> Trace:
        if not self.ids:
            raise KvscopeError(f"{source} is empty: no requests to replay")
        order = np.argsort(np.array(self.start_ms), kind="stable")
        pick = [int(i) for i in order]
        derived = _previous_agents(
            [self.agents[i] for i in pick], [self.workflows[i] for i in pick]
        )
        previous = [
            derived[j] if self.previous[i] is False else self.previous[i]
            for j, i in enumerate(pick)
        ]
        flat, counts = keys.sorted(order)
        offsets = np.zeros(len(pick) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return Trace(
            source=str(source),
            block_size=block_size,
            request_ids=tuple(self.ids[i] for i in pick),
            start_s=np.array([self.start_ms[i] for i in pick], dtype=np.float64) / 1e3,
            end_s=np.array([self.end_ms[i] for i in pick], dtype=np.float64) / 1e3,
            prompt_tokens=np.array([self.prompt[i] for i in pick], dtype=np.int64),
            output_tokens=np.array([self.output[i] for i in pick], dtype=np.int64),
            keys=flat,
            offsets=offsets,
            agents=tuple(self.agents[i] for i in pick),
            workflows=tuple(self.workflows[i] for i in pick),
            previous_agents=tuple(previous),  # type: ignore[arg-type]
        )


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


def _block_size_check(path: Path, n: int, ids: int, length: int, block_size: int) -> None:
    """hash_ids must be the blocks of `length` tokens: between the full ones and all of them."""
    full, blocks = length // block_size, -(-length // block_size)
    if full <= ids <= blocks:
        return
    if ids and length:  # the block sizes whose ceil(length / size) is `ids`
        lo, hi = -(-length // ids), (-(-length // (ids - 1)) - 1 if ids > 1 else None)
        fits = f"{lo}" if hi == lo else f"{lo} to {hi}" if hi else f"{lo} or more"
        hint = f"; {ids} ids fit a block size of {fits}"
    else:
        hint = ""
    raise KvscopeError(
        f"{path}:{n}: field 'hash_ids' has {ids} ids, but input_length {length} is {blocks} "
        f"blocks of {block_size} tokens ({full} full){hint}: is --block-size right?"
    )


def read_mooncake(path: Path, block_size: int) -> Trace:
    """A Mooncake trace: `hash_ids` are the block keys (see the module doc)."""
    rows, keys = Rows(), KeyChunks()
    for n, row, line in lines(path, lift="hash_ids", dtype=np.uint64):
        start = float(field_of(path, n, row, "timestamp", (int, float)))
        length = length_of(path, n, row, "input_length")
        output = length_of(path, n, row, "output_length")
        hash_ids = ids_of(path, n, row, "hash_ids", line)
        _block_size_check(path, n, len(hash_ids), length, block_size)
        rows.prompt.append(length)
        rows.output.append(output)
        keys.add(hash_ids[: length // block_size])
        rows.add(path, n, row, str(row.get("request_id", f"line-{n}")), start)
    return rows.trace(path, block_size, keys)


class _Hasher:
    """Prompts' token ids in, their block keys out, hashed a batch of ~BATCH_TOKENS at a time."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.pending: list[np.ndarray] = []
        self.tokens = 0
        self.keys = KeyChunks()  # per prompt, in the order added

    def add(self, ids: np.ndarray) -> None:
        self.pending.append(ids)
        self.tokens += len(ids)
        if self.tokens >= BATCH_TOKENS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            keys, offsets = chain_keys(self.pending, self.block_size)
            self.keys.add_flat(keys, np.diff(offsets))
        self.pending, self.tokens = [], 0


def read_token_trace(path: Path, block_size: int) -> tuple[Trace, list[str]]:
    """A token-id trace: keys are chained from the token ids (see the module doc); and notes."""
    rows, hasher = Rows(), _Hasher(block_size)
    no_output = 0
    for n, row, line in lines(path, lift="token_ids"):
        rid = str(field_of(path, n, row, "request_id", (str, int)))
        tokens = ids_of(path, n, row, "token_ids", line)
        given = row.get("output_length") is not None
        no_output += not given
        rows.output.append(length_of(path, n, row, "output_length") if given else 0)
        hasher.add(tokens)
        rows.prompt.append(len(tokens))
        rows.add(path, n, row, rid, _ms(path, n, row, "timestamp", float(len(rows.ids))))
    hasher.flush()
    notes = [f"{no_output} requests without output_length: replayed with 0"] if no_output else []
    return rows.trace(path, block_size, hasher.keys), notes
