"""Routing misses: prompt tokens a call computed on its replica that another replica held.

One block ledger per replica (finalize.provenance.build_ledger over that replica's KV events
only: a block stored on replica A is never a hit on replica B). For a call served by replica X
and scheduled at t (provenance.admitted_ns), the best other replica R is the one
holding the longest contiguous run of the prompt's prefix blocks at t (a prefix cache serves
only such a run); the routing miss is the blocks past the call's reported cached tokens, within
R's run, that were not resident on X at t, in tokens (at most the call's uncached tokens).

This overlaps the uncached causes of provenance (a block evicted or cold on X may be resident
on R): it is what a router that knew every replica's cache would have saved the call.
None for a call that was not measured (failed, counts not reported, no prompt tokens or not as
many as the engine counted, no known replica) and for every call when fewer than two ledgers
are given (no other replica to miss).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvscope.finalize import keylives, piecehash
from kvscope.finalize.keylives import KeyLives
from kvscope.finalize.prompts import Prompts, Tokens, as_prompts
from kvscope.finalize.provenance import BlockLife, Ledger, admitted_ns
from kvscope.records.base import Row
from kvscope.records.requests import STATUS_OK

COLUMNS = ("routing_miss_tokens", "routing_miss_replica")


def _measured(r: Row) -> bool:
    return (
        r.get("status") == STATUS_OK
        and r.get("cached_tokens") is not None
        and r.get("prompt_tokens") is not None
    )


def _usable(r: Row, tokens: Prompts, ledgers: Mapping[str, Ledger]) -> bool:
    """Measured, on a replica with a ledger, with prompt ids that match the engine's count (as
    provenance: a tokenization that differs from the engine's is never used)."""
    ids = tokens.get(r["request_uuid"])
    return (
        _measured(r)
        and r.get("replica") in ledgers
        and ids is not None
        and tokens.lengths[ids] == r["prompt_tokens"]
    )


@dataclass(frozen=True)
class RoutingMiss:
    request_uuid: str
    tokens: int  # uncached here, cached on `cached_on` then
    cached_on: str | None  # the best other replica; None when no other held a block


def routing_misses(
    rows: Sequence[Row], tokens: Prompts | Mapping[str, Tokens], ledgers: Mapping[str, Ledger]
) -> dict[str, RoutingMiss | None]:
    """request_uuid -> its routing miss (the module docstring); None: not measured."""
    out: dict[str, RoutingMiss | None] = {r["request_uuid"]: None for r in rows}
    sizes = {x.block_size for x in ledgers.values() if x.block_size is not None}
    if len(ledgers) < 2 or not sizes:
        return out
    if len(sizes) > 1:
        raise ValueError(f"replicas with different block sizes {sorted(sizes)}: not comparable")
    size = sizes.pop()
    lives = {
        rep: keylives.by_key((x.key, x) for x in led.lives if x.key is not None)
        for rep, led in ledgers.items()
    }
    tokens = as_prompts(tokens)
    usable = [r for r in rows if _usable(r, tokens, ledgers)]
    if not usable:
        return out
    keys, _, offsets = piecehash.prompt_blocks(
        tokens.named(r["request_uuid"] for r in usable), size, hashes=False
    )
    flat, bounds = keys.tolist(), offsets.tolist()
    for j, r in enumerate(usable):
        t = admitted_ns(r)
        mine = flat[bounds[j] : bounds[j + 1]]
        out[r["request_uuid"]] = _miss(r, mine, t, size, lives)
    return out


def _miss(
    r: Row,
    keys: list[int],
    t: int,
    size: int,
    lives: Mapping[str, Mapping[int, KeyLives[BlockLife]]],
) -> RoutingMiss:
    own = lives[r["replica"]]
    best, best_run = None, 0
    for rep in sorted(lives):
        if rep == r["replica"]:
            continue
        run = _resident_run(lives[rep], keys, t)
        if run > best_run:
            best, best_run = rep, run
    hit_blocks = min(r["cached_tokens"] // size, len(keys))
    missed = sum(1 for i in range(hit_blocks, best_run) if not _resident(own, keys[i], t))
    uncached = max(r["prompt_tokens"] - r["cached_tokens"], 0)
    return RoutingMiss(r["request_uuid"], min(missed * size, uncached), best)


def _resident(by_key: Mapping[int, KeyLives[BlockLife]], key: int, t: int) -> bool:
    found = by_key.get(key)
    return found is not None and found.resident(t) is not None


def _resident_run(by_key: Mapping[int, KeyLives[BlockLife]], keys: list[int], t: int) -> int:
    """How many of the prompt's blocks, from the first, were resident at t without a gap."""
    n = 0
    while n < len(keys) and _resident(by_key, keys[n], t):
        n += 1
    return n


def routing_columns(
    rows: Sequence[Row], tokens: Prompts | Mapping[str, Tokens], ledgers: Mapping[str, Ledger]
) -> list[Row]:
    """The rows with COLUMNS set in place (the same rows, as a list): routing_miss_tokens,
    routing_miss_replica (R's name; None when no other replica held any of the prompt's
    blocks, or not measured)."""
    misses = routing_misses(rows, tokens, ledgers)
    for r in rows:
        m = misses.get(r["request_uuid"])
        r[COLUMNS[0]], r[COLUMNS[1]] = (m.tokens, m.cached_on) if m else (None, None)
    return list(rows)
