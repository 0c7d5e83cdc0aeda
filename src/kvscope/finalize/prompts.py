"""Prompt token ids held once per distinct piece: what finalize reads the prompt-token stream into.

A prompt is cut into pieces of `piece` tokens (PIECE) from its start, its last piece possibly
shorter. Prompts sharing a prefix share the prefix's whole pieces, and the calls of a multi-agent
run share long prefixes (a system prompt, an agent's instructions, a workflow's context growing
call by call): each distinct piece is held once, and a prompt is the list of its pieces. On a
PEER-like 100k-call run the distinct pieces hold a quarter of the tokens (bench/finalize_run.py):
at 4 bytes a token id (vocabularies past 65,536) ~110 MiB instead of ~460 MiB.

Pieces are told apart by a 64-bit hash of their tokens and length (records.blockkey): two
distinct pieces of one hash (about n^2 / 2^65 for n distinct pieces) would be taken as one, as
two blocks of one key are throughout finalize.

Prompts is the record (immutable by convention: its arrays are not written after it is built);
PromptsBuilder builds one a batch of prompts at a time; load_prompts reads a run's stream
(records.tokens.token_chunks: Arrow columns, flat ids and offsets) into one, chunk by chunk, so
the whole stream's ids are never held.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvscope.records import blockkey
from kvscope.records.blockkey import Tokens
from kvscope.records.tokens import token_chunks

# tokens a piece: smaller shares more of a prefix, larger has fewer pieces to sort and hash;
# block sizes dividing it (16 .. 128) get their keys from the pieces (finalize.piecehash)
PIECE = 128


@dataclass(frozen=True)
class Prompts:
    """Prompts as lists of distinct pieces: prompt i's k-th piece is rows[seq[offsets[i] + k]],
    its first width[...] tokens. Implements records.blockkey.Batches."""

    rows: np.ndarray  # (distinct pieces, piece): each's tokens, 0 past its width
    width: np.ndarray  # int64, per distinct piece: its tokens (1 .. piece)
    seq: np.ndarray  # int64: each prompt's pieces in order, prompt after prompt
    offsets: np.ndarray  # int64: prompt i's pieces are seq[offsets[i] : offsets[i + 1]]
    lengths: np.ndarray  # int64, per prompt: its tokens
    index: Mapping[str, int] = field(default_factory=dict)  # request_uuid -> its prompt

    @classmethod
    def of(
        cls, prompts: Sequence[Tokens], piece: int = PIECE, names: Sequence[str] = ()
    ) -> "Prompts":
        """The prompts (arrays keep their dtype, lists are int64), `names[i]` naming prompt i."""
        arrays = [p if isinstance(p, np.ndarray) else np.array(p, dtype=np.int64) for p in prompts]
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        kept = [a for a in arrays if len(a)]
        flat = np.concatenate(kept) if kept else np.zeros(0, dtype=np.uint16)
        stops = np.cumsum(lengths)
        builder = PromptsBuilder(piece)
        builder.add(flat, stops - lengths, stops)
        return builder.build({n: i for i, n in enumerate(names)})

    @property
    def piece(self) -> int:
        return self.rows.shape[1]

    @property
    def dtype(self) -> np.dtype:
        return self.rows.dtype

    def __len__(self) -> int:
        return len(self.lengths)

    def get(self, uuid: str) -> int | None:
        """The prompt of the call `uuid`; None when the stream has none."""
        return self.index.get(uuid)

    def tokens(self, i: int) -> np.ndarray:
        """Prompt i's token ids."""
        return self.concat(i, i + 1)

    def concat(self, lo: int, hi: int) -> np.ndarray:
        """The token ids of prompts lo .. hi - 1, end to end."""
        s = self.seq[self.offsets[lo] : self.offsets[hi]]
        rows, width = self.rows[s], self.width[s]
        if (width == self.piece).all():
            return rows.ravel()
        return rows[np.arange(self.piece) < width[:, None]]

    def named(self, uuids: Iterable[str]) -> "Prompts":
        """The prompts of the calls `uuids` (each must have one), in that order (select)."""
        return self.select([self.index[u] for u in uuids])

    def select(self, which: Sequence[int] | np.ndarray) -> "Prompts":
        """The prompts `which`, in that order (the pieces shared, not copied; no index)."""
        which = np.asarray(which, dtype=np.int64)
        counts = self.offsets[which + 1] - self.offsets[which]
        offsets = np.zeros(len(which) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        at = np.repeat(self.offsets[which] - offsets[:-1], counts) + np.arange(offsets[-1])
        return Prompts(self.rows, self.width, self.seq[at], offsets, self.lengths[which])


class PromptsBuilder:
    """Prompts added a batch at a time (add), each distinct piece stored once (rows grown in
    place), then built (build). Memory: the distinct pieces, 8 bytes a prompt piece, and the
    known pieces' hashes (16 bytes a distinct piece)."""

    def __init__(self, piece: int = PIECE) -> None:
        self.piece = piece
        self.rows = np.zeros((0, piece), dtype=np.uint16)  # capacity: grown by doubling
        self.n = 0  # distinct pieces stored
        self.width: list[np.ndarray] = []
        self.known = np.zeros(0, dtype=np.uint64)  # the stored pieces' hashes, sorted
        self.known_id = np.zeros(0, dtype=np.int64)  # the piece of each
        self.seq: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        self.count = 0  # prompts added

    def add(self, flat: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        """The prompts flat[starts[k] : stops[k]], in order (spans in order, not overlapping)."""
        size = self.piece
        lengths = np.asarray(stops, dtype=np.int64) - starts
        self.lengths.append(lengths)
        self.count += len(lengths)
        counts = -(-lengths // size)
        n = int(counts.sum())
        if not n:
            return
        begin = np.repeat(np.asarray(starts, dtype=np.int64), counts)
        begin += blockkey.within(counts) * size
        end = np.minimum(begin + size, np.repeat(np.asarray(stops, dtype=np.int64), counts))
        hashes = blockkey.span_hashes(flat, begin, end)
        uniq, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        del hashes
        at = np.searchsorted(self.known, uniq)
        found = at < len(self.known)
        found[found] = self.known[at[found]] == uniq[found]
        ids = np.empty(len(uniq), dtype=np.int64)
        ids[found] = self.known_id[at[found]]
        new = np.flatnonzero(~found)
        ids[new] = np.arange(self.n, self.n + len(new))
        self._store(flat, begin[first[new]], end[first[new]])
        self.known = np.insert(self.known, at[new], uniq[new])
        self.known_id = np.insert(self.known_id, at[new], ids[new])
        self.seq.append(ids[inverse.ravel()])

    def _store(self, flat: np.ndarray, begin: np.ndarray, end: np.ndarray) -> None:
        """New distinct pieces: flat[begin[k] : end[k]] each."""
        k = len(begin)
        dtype = np.promote_types(self.rows.dtype, flat.dtype)
        if dtype != self.rows.dtype:
            self.rows = self.rows.astype(dtype)
        if self.n + k > len(self.rows):  # in place: for a large array a remap, not a copy
            grown = max(2 * len(self.rows), self.n + k, 1024)
            self.rows.resize((grown, self.piece), refcheck=False)
        width = end - begin
        cols = np.arange(self.piece)
        got = flat[np.minimum(begin[:, None] + cols, max(len(flat) - 1, 0))]
        got[cols >= width[:, None]] = 0
        self.rows[self.n : self.n + k] = got
        self.width.append(width)
        self.n += k

    def build(self, index: Mapping[str, int] | None = None) -> Prompts:
        """The prompts added, `index` naming them; the builder is spent."""
        lengths = _joined(self.lengths)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(-(-lengths // self.piece), out=offsets[1:])
        self.rows.resize((self.n, self.piece), refcheck=False)
        rows, self.rows = self.rows, self.rows[:0]
        return Prompts(rows, _joined(self.width), _joined(self.seq), offsets, lengths, index or {})


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def load_prompts(run_dir: Path) -> Prompts:
    """The run's prompt token ids (its prompt-token stream, read as records.tokens.load_tokens
    states), each prompt named by its request_uuid; none when the run has no stream."""
    builder = PromptsBuilder()
    index: dict[str, int] = {}
    for c in token_chunks(run_dir):
        first = builder.count
        builder.add(c.flat, c.starts[c.valid], c.stops[c.valid])
        named = (u for u, ok in zip(c.uuids, c.valid.tolist(), strict=True) if ok)
        for number, uuid in enumerate(named, first):  # in order: a uuid's last record wins
            index[uuid] = number
    return builder.build(index)


def as_prompts(tokens: "Prompts | Mapping[str, Tokens | None]") -> Prompts:
    """`tokens` as Prompts: itself, or a mapping request_uuid -> ids (None: no ids) as one."""
    if isinstance(tokens, Prompts):
        return tokens
    named = [(u, t) for u, t in tokens.items() if t is not None]
    return Prompts.of([t for _, t in named], names=[u for u, _ in named])
