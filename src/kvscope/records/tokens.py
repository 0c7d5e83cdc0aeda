"""The prompt-token stream: each call's exact prompt token ids, appended as the call is sent, so
that `kvscope convert` can match a crashed run's prompts to KV blocks; and the prefix relation
between token sequences that the first-divergence columns are defined by.

The stream is prompt_tokens.arrow, an Arrow IPC stream (records.base.ArrowWriter) of TOKENS_SCHEMA:
one record batch per call, {request_uuid: string, token_ids: list<uint32>}, written and flushed
as the call is sent (a crash loses no finished call; a torn last batch is left off on reading).
Token ids lie in [0, 2**32): PromptTokenIds.to_batch refuses others (ValueError). A process that
captures for a session it does not own writes prompt_tokens.arrow.<pid>, which the session appends
to the stream, batch by batch, on close (probe.streams.merge_parts). Runs written before this
format have prompt_tokens.jsonl (one JSON object per line, same fields), read the same way.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from kvscope.records.arrays import flags, numbers
from kvscope.records.base import ArrowBatches, read_jsonl, record_dict

TOKENS_ARROW = "prompt_tokens.arrow"
TOKENS_JSONL = "prompt_tokens.jsonl"  # the stream of runs written before TOKENS_ARROW: read only
TOKENS_SCHEMA = pa.schema(
    [
        pa.field("request_uuid", pa.string(), nullable=False),
        pa.field("token_ids", pa.list_(pa.uint32())),  # null: the call has no ids
    ]
)
_IDS = pa.list_(pa.uint32())
_U32 = 1 << 32


@dataclass(frozen=True)
class PromptTokenIds:
    request_uuid: str
    token_ids: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    def to_batch(self) -> pa.RecordBatch:
        """This call's record batch of the stream (TOKENS_SCHEMA); a ValueError for an id
        outside [0, 2**32)."""
        column = id_lists([self.token_ids], f"prompt token ids of {self.request_uuid}")
        uuid = pa.array([self.request_uuid], pa.string())
        return pa.RecordBatch.from_arrays([uuid, column], schema=TOKENS_SCHEMA)


def id_lists(lists: Sequence[Sequence[int]], what: str) -> pa.ListArray:
    """Token id lists as list<uint32>, without a Python object per id; a ValueError naming
    `what` for an id outside [0, 2**32)."""
    try:
        arrays = [np.fromiter(x, dtype=np.int64, count=len(x)) for x in lists]
    except OverflowError as err:
        raise ValueError(f"{what}: an id outside [0, 2**32) (uint32 in the stream)") from err
    flat = arrays[0] if len(arrays) == 1 else np.concatenate([np.zeros(0, np.int64), *arrays])
    if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= _U32):
        bad = int(flat[(flat < 0) | (flat >= _U32)][0])
        raise ValueError(f"{what}: id {bad} is outside [0, 2**32) (uint32 in the stream)")
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(x) for x in arrays], out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(np.uint32)), type=_IDS)


def tokens_path(run_dir: Path) -> Path | None:
    """The run's prompt-token stream: prompt_tokens.arrow, else an older run's
    prompt_tokens.jsonl; None when the run has neither."""
    for name in (TOKENS_ARROW, TOKENS_JSONL):
        if (run_dir / name).exists():
            return run_dir / name
    return None


def has_tokens(run_dir: Path) -> bool:
    """Whether the run captured prompt token ids (has a prompt-token stream)."""
    return tokens_path(run_dir) is not None


def narrowest_dtype(lo: int, hi: int) -> np.dtype:
    """The smallest integer dtype holding every value in [lo, hi]: uint16, int32 or int64."""
    if lo >= 0 and hi < 1 << 16:
        return np.dtype(np.uint16)
    if lo >= -(1 << 31) and hi < 1 << 31:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


@dataclass(frozen=True)
class TokenChunk:
    """Consecutive records of the stream: record i is uuids[i] with the ids
    flat[starts[i] : stops[i]], or no ids where `valid[i]` is False (null token_ids). `flat`
    has the chunk's narrowest dtype (narrowest_dtype of its least and greatest id)."""

    uuids: list[str]
    flat: np.ndarray
    starts: np.ndarray  # int64
    stops: np.ndarray  # int64
    valid: np.ndarray  # bool

    @classmethod
    def of(cls, uuids: pa.Array, ids: pa.Array) -> "TokenChunk":
        """From a string column and a list<integer> column (no Python int per id)."""
        lengths = numbers(pc.list_value_length(ids), fill=0).astype(np.int64)
        flat = numbers(pc.list_flatten(ids))  # a null list has no values
        valid = flags(ids.is_valid())
        return cls.of_flat(uuids.to_pylist(), flat, lengths, valid)

    @classmethod
    def of_flat(
        cls, uuids: list[str], flat: np.ndarray, lengths: np.ndarray, valid: np.ndarray
    ) -> "TokenChunk":
        """Record i: uuids[i] and the next lengths[i] ids of `flat` (valid[i]: False for none)."""
        if len(flat):
            flat = flat.astype(narrowest_dtype(int(flat.min()), int(flat.max())), copy=False)
        else:
            flat = np.zeros(0, dtype=np.uint16)
        stops = np.cumsum(lengths)
        return cls(uuids, flat, stops - lengths, stops, valid)


def token_chunks(run_dir: Path) -> Iterator[TokenChunk]:
    """The run's prompt-token stream in order, a chunk of records at a time (a few MB of ids
    each): what load_tokens and finalize.prompts.load_prompts read. A torn last batch (or, in an
    older run's JSONL stream, a line that is not an object with a string request_uuid and a
    list of integer token_ids) is left off. None when the run has no stream."""
    path = tokens_path(run_dir)
    if path is None:
        return
    if path.name == TOKENS_JSONL:
        yield _legacy_chunk(path)
        return
    for batch in ArrowBatches(path).chunks():
        yield TokenChunk.of(batch.column(0), batch.column(1))


_LEGACY = pa.schema([("request_uuid", pa.string()), ("token_ids", pa.list_(pa.int64()))])


def _legacy_chunk(path: Path) -> TokenChunk:
    """An older run's prompt_tokens.jsonl: read by pyarrow's JSON reader, or line by line (by
    orjson, through records.base.read_jsonl) where it refuses the file (a torn line) or reads
    what is not a list of integers."""
    options = pa_json.ParseOptions(explicit_schema=_LEGACY, unexpected_field_behavior="ignore")
    try:
        table = pa_json.read_json(path, parse_options=options)
        uuids, ids = (table.column(k).combine_chunks() for k in (0, 1))
        if not uuids.null_count and not pc.list_flatten(ids).null_count:
            return TokenChunk.of(uuids, ids)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    rows, _ = read_jsonl(path, _legacy_row)
    kept = [r for r in rows if r is not None]
    lists = [ids for _, ids in kept]
    lengths = np.array([0 if x is None else len(x) for x in lists], dtype=np.int64)
    flat = np.concatenate([np.zeros(0, np.int64), *(x for x in lists if x is not None)])
    valid = np.array([x is not None for x in lists], dtype=bool)
    return TokenChunk.of_flat([u for u, _ in kept], flat, lengths, valid)


def _legacy_row(row: Any) -> tuple[str, np.ndarray | None] | None:
    """(request_uuid, token_ids) of a JSONL line; None for a line of another shape."""
    if not isinstance(row, dict) or not isinstance(row.get("request_uuid"), str):
        return None
    ids = row.get("token_ids")
    if ids is None:
        return row["request_uuid"], None
    if not isinstance(ids, list) or not all(
        type(x) is int and -(1 << 63) <= x < 1 << 63 for x in ids
    ):
        return None
    return row["request_uuid"], np.array(ids, dtype=np.int64)


def load_tokens(run_dir: Path) -> dict[str, np.ndarray]:
    """request_uuid -> its prompt token ids, as integer arrays; empty when the run has no stream.

    Every array has one dtype, the smallest holding every id of the stream: uint16 when all lie
    in [0, 2**16) (2 bytes a token: vocabularies up to 65,536), else int32, else int64. The
    arrays are views of a few flat arrays (the stream is read a chunk at a time: token_chunks).
    A record whose token_ids is null is ignored; a request_uuid written twice keeps its last
    record; a torn record (a crash mid-write) is left off. Consumers must not assume a signed
    dtype: widen (astype) before arithmetic that can leave [0, 2**16).
    """
    chunks = list(token_chunks(run_dir))
    dtype = np.dtype(np.uint16)
    for c in chunks:
        dtype = np.promote_types(dtype, c.flat.dtype)
    out: dict[str, np.ndarray] = {}
    for c in chunks:
        flat = c.flat.astype(dtype, copy=False)
        for uuid, lo, hi, ok in zip(
            c.uuids, c.starts.tolist(), c.stops.tolist(), c.valid.tolist(), strict=True
        ):
            if ok:
                out[uuid] = flat[lo:hi]
    return out


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix: the first index where a and b differ."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.asarray(a[:n]) != np.asarray(b[:n])
    i = int(differ.argmax())  # the first True, or 0 when there is none
    return i if differ[i] else n
