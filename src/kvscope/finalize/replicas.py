"""Which replica served each call behind a router, read from what the replicas themselves wrote.

vllm-router 0.1.17 names no worker in its reply (no header, no body field) and logs no routing
decision per request at info level (seen with bench/router_probe.py, see engines/vllm_router.py), so
kvscope asks the replicas: a vLLM replica started with `--enable-log-requests` logs
`Added request chatcmpl-<id>-<8 hex>.` for every request it schedules, where <id> is the
request's X-Request-Id header or its `request_id` body field (kvscope sends its request_uuid in
both, and the router forwards them). A call found in exactly one replica's log was served
there; found in none (log lost, a request refused before scheduling) or in several (a retry by
the router after a failure) its replica is None, never guessed.

SGLang replicas behind sglang-router 0.3.2 keep neither of kvscope's body fields: the router
rebuilds the body and drops `rid` and `session_id` (engines/sglang_router.py), so SGLang names
each call with a rid of its own (32 hex), which is also the reply's `id` (sglang_response_id).
The router forwards one header, x-request-id (kvscope's request_uuid, SglangEngine.request_tags),
and a replica launched with SGLANG_LOG_REQUEST_HEADERS=x-request-id (engines.deployment) writes
it beside its rid in its JSON request log (`--log-requests-format json`, replicas/<name>/
request_logs/): `{"event": "request.received", "rid": ..., "obj": ..., "headers":
{"x-request-id": ...}}`. `sglang_requests` reads a log's rid -> header; `from_sglang_logs`
places a call by its header, else by its reply's id among the rids (a log without the header).

A last, independent witness is the replicas' KV events: a BlockStored carries the request's
session_id (kvscope's request_uuid), so a call that stored a block is seen on its replica's
stream. It covers only calls that computed at least one full block, and no call behind
sglang-router (the session_id is dropped with the body); `from_kv_events` gives it.
"""

import re
from collections.abc import Iterable, Mapping, Sequence

import orjson

from kvscope.engines.base import REQUEST_ID_HEADER
from kvscope.records.base import Row

ADDED = re.compile(r"Added request (\S+?)\.?\s*$", re.MULTILINE)
SGLANG_EVENTS = ('"request.received"', '"request.finished"')  # the lines that name a request
Seen = Mapping[str, str | None]  # one SGLang replica's rid -> the x-request-id it logged


def from_logs(logs: Mapping[str, str], request_ids: Iterable[str]) -> dict[str, str | None]:
    """request id -> the one replica (a key of `logs`, its log text) that added it; else None."""
    added = {name: " ".join(ADDED.findall(text)) for name, text in logs.items()}
    out: dict[str, str | None] = {}
    for rid in request_ids:
        found = [name for name, ids in added.items() if rid in ids]
        out[rid] = found[0] if len(found) == 1 else None
    return out


def sglang_requests(lines: Iterable[str]) -> dict[str, str | None]:
    """An SGLang JSON request log's lines (each `[time] {json}`, or the JSON alone) -> rid ->
    the x-request-id header logged with it (None: logged without one). Other lines, torn or
    not JSON, are skipped."""
    out: dict[str, str | None] = {}
    for line in lines:
        start = line.find("{")
        if start < 0 or not any(e in line for e in SGLANG_EVENTS):
            continue
        try:
            rec = orjson.loads(line[start:])
        except orjson.JSONDecodeError:
            continue
        rid = rec.get("rid") if isinstance(rec, dict) else None
        if not isinstance(rid, str):
            continue
        headers = rec.get("headers")
        header = headers.get(REQUEST_ID_HEADER) if isinstance(headers, dict) else None
        out[rid] = header if isinstance(header, str) else out.get(rid)
    return out


def from_sglang_logs(seen: Mapping[str, Seen], rows: Sequence[Row]) -> dict[str, str | None]:
    """request_uuid -> the one replica whose SGLang request log names the call: by the
    x-request-id header it logged (the request_uuid), else by the reply's id (a rid); None
    where no log, or more than one, names it."""
    headers = {name: {h for h in s.values() if h} for name, s in seen.items()}
    out: dict[str, str | None] = {}
    for r in rows:
        uuid, reply = r["request_uuid"], r.get("sglang_response_id")
        found = [name for name, hs in headers.items() if uuid in hs]
        if not found and reply:
            found = [name for name, s in seen.items() if reply in s]
        out[uuid] = found[0] if len(found) == 1 else None
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
    rows: Sequence[Row],
    logs: Mapping[str, str],
    stored: Mapping[str, Iterable[str | None]],
    sglang: Mapping[str, Seen] | None = None,
) -> list[Row]:
    """The rows with `replica` set in place (the same rows, as a list): from the replicas' logs
    (vLLM's engine log, else SGLang's request log: `sglang`, each replica's sglang_requests),
    else from their KV events (the session_ids of the blocks each stored); None where none
    tells one replica."""
    ids = [r["request_uuid"] for r in rows]
    by_log = from_logs(logs, ids)
    if sglang and any(sglang.values()):
        unplaced = [r for r in rows if by_log[r["request_uuid"]] is None]
        by_log |= {i: p for i, p in from_sglang_logs(sglang, unplaced).items() if p}
    by_events = from_kv_events(stored, [i for i in ids if by_log[i] is None])
    for r, i in zip(rows, ids, strict=True):
        r["replica"] = by_log[i] or by_events.get(i)
    return list(rows)
