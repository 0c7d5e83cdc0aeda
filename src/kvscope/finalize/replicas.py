"""Which replica served each call behind a router, read from what the replicas themselves wrote.

vllm-router 0.1.17 names no worker in its reply (no header, no body field) and logs no routing
decision per request at info level (seen with bench/router_probe.py, see engines/vllm_router.py), so
kvscope asks the replicas: a vLLM replica started with `--enable-log-requests` logs
`Added request chatcmpl-<id>-<8 hex>.` for every request it schedules, where <id> is the
request's X-Request-Id header or its `request_id` body field (kvscope sends its request_uuid in
both, and the router forwards them). A call found in exactly one replica's log was served
there; found in none (log lost, a request refused before scheduling) or in several (a retry by
the router after a failure) its replica is None, never guessed.

A second, independent witness is the replicas' KV events: a BlockStored carries the request's
session_id (kvscope's request_uuid), so a call that stored a block is seen on its replica's
stream. It covers only calls that computed at least one full block; `from_kv_events` gives it.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = dict[str, Any]
ADDED = re.compile(r"Added request (\S+?)\.?\s*$", re.MULTILINE)


def from_logs(logs: Mapping[str, str], request_ids: Iterable[str]) -> dict[str, str | None]:
    """request id -> the one replica (a key of `logs`, its log text) that added it; else None."""
    added = {name: " ".join(ADDED.findall(text)) for name, text in logs.items()}
    out: dict[str, str | None] = {}
    for rid in request_ids:
        found = [name for name, ids in added.items() if rid in ids]
        out[rid] = found[0] if len(found) == 1 else None
    return out


def from_kv_events(
    session_ids: Mapping[str, Iterable[str | None]], request_ids: Iterable[str]
) -> dict[str, str | None]:
    """request id -> the one replica whose stored blocks name it as session_id; else None."""
    seen = {name: {s for s in ids if s} for name, ids in session_ids.items()}
    out: dict[str, str | None] = {}
    for rid in request_ids:
        found = [name for name, ids in seen.items() if rid in ids]
        out[rid] = found[0] if len(found) == 1 else None
    return out


def place(
    rows: Sequence[Row], logs: Mapping[str, str], stored: Mapping[str, Iterable[str | None]]
) -> list[Row]:
    """The rows with `replica` set in place (the same rows, as a list): from the replicas' logs,
    else from their KV events (the session_ids of the blocks each stored); None where neither
    tells one replica."""
    ids = [r["request_uuid"] for r in rows]
    by_log = from_logs(logs, ids)
    by_events = from_kv_events(stored, [i for i in ids if by_log[i] is None])
    for r, i in zip(rows, ids, strict=True):
        r["replica"] = by_log[i] or by_events.get(i)
    return list(rows)
