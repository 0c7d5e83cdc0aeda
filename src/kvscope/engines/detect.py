"""Capability detection: what a running engine actually reports, seen with one probe request."""

import json
import time
import uuid
from collections.abc import Mapping, Sequence

import httpx
import zmq
from prometheus_client.metrics_core import Metric

from kvscope.engines import auth
from kvscope.engines.base import Capabilities, Endpoints, Engine, parse_metrics
from kvscope.engines.kv_events import receive, replay, subscriber
from kvscope.errors import EngineError
from kvscope.records.kv_events import KvBatch

# Long enough to fill whole KV blocks (vLLM CPU: 128 tokens), so that a store event must follow.
_FILLER = " ".join(f"ledger line {i} stays stable." for i in range(80))
QUICK_S = 0.5  # the live socket's first look for the probe's event, before the replay buffer


def fetch_metrics(client: httpx.Client, url: str | None) -> list[Metric] | None:
    """Parsed /metrics, or None when the server has none (404, refused, not Prometheus text)."""
    if url is None:
        return None
    try:
        resp = client.get(url)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        return parse_metrics(resp.text)
    except ValueError:
        return None


def list_models(client: httpx.Client, base_url: str) -> tuple[str, ...]:
    try:
        resp = client.get(f"{base_url}/v1/models")
        resp.raise_for_status()
        return tuple(m["id"] for m in resp.json()["data"])
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as err:
        raise EngineError(f"no OpenAI-compatible server at {base_url} ({err})") from None


def stream_usage(
    client: httpx.Client,
    base_url: str,
    model: str,
    prompt: str | list[dict[str, str]],
    max_tokens: int = 1,
) -> dict | None:
    """Send one streamed chat request and return the usage of its final chunk."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage = None
    with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            resp.read()
            raise EngineError(f"probe request failed: HTTP {resp.status_code}: {resp.text[:200]}")
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            try:
                chunk = json.loads(line[5:])
            except json.JSONDecodeError:
                continue
            if chunk.get("usage"):
                usage = chunk["usage"]
    return usage


def reports_cached_tokens(usage: dict | None) -> bool:
    details = (usage or {}).get("prompt_tokens_details")
    return isinstance(details, dict) and isinstance(details.get("cached_tokens"), int)


def _stored(batches: list[KvBatch]) -> bool:
    return any(e.kind == "stored" for b in batches for e in b.events)


def _probe_stored(
    sock: zmq.Socket, replay_endpoint: str | None, sent: float, wait_s: float
) -> tuple[bool, bool]:
    """(whether the probe's BlockStored event came within `wait_s`, whether only through the
    replay buffer). A publisher's first batch after a subscriber joins can be dropped on the
    live socket (seen on every fresh vLLM: the probe then waited all of `wait_s`), and the
    replay buffer still holds it: so the live socket for up to QUICK_S, then the buffer, then
    the live socket for the rest of `wait_s`, then the buffer once more."""
    deadline = time.monotonic() + wait_s
    if _stored(receive(sock, min(QUICK_S, wait_s))):
        return True, False
    while True:
        if replay_endpoint is not None:
            batches = replay(replay_endpoint)
            if _stored([b for b in batches if b.ts_ns >= (sent - 1) * 1e9]):
                return True, True
        left = deadline - time.monotonic()
        if left <= 0:
            return False, False
        if _stored(receive(sock, left)):
            return True, False
        deadline = time.monotonic()  # waited it all: the buffer once more, then done


def detect(
    endpoints: Endpoints,
    engines: Sequence[type[Engine]],
    *,
    timeout_s: float = 60.0,
    kv_wait_s: float = 5.0,
    headers: Mapping[str, str] | None = None,
) -> Capabilities:
    """Probe a running engine: models, cached-token reporting, /metrics, KV events. `headers`:
    the engine's API key (engines/auth.py; default: from the environment)."""
    notes: list[str] = []
    keyed = auth.headers() if headers is None else dict(headers)
    with httpx.Client(timeout=timeout_s, headers=keyed) as client:
        models = list_models(client, endpoints.base_url)
        if not models:
            raise EngineError(f"{endpoints.base_url}/v1/models lists no model")
        prompt = f"[{uuid.uuid4()}] {_FILLER} Say ok."  # unique head: never a cache hit
        kv_events: bool | None = None
        if endpoints.kv_events:
            try:
                with subscriber(endpoints.kv_events, endpoints.kv_events_subscriber_binds) as s:
                    time.sleep(0.5)  # let the PUB/SUB link form before anything is published
                    sent = time.time()
                    usage = stream_usage(client, endpoints.base_url, models[0], prompt)
                    kv_events, replayed = _probe_stored(
                        s, endpoints.kv_events_replay, sent, kv_wait_s
                    )
            except zmq.ZMQError as err:
                raise EngineError(f"KV events endpoint {endpoints.kv_events}: {err}") from None
            if replayed:
                notes.append("KV events: the probe's batch came only through replay")
            if not kv_events:
                notes.append(f"no BlockStored event within {kv_wait_s:.0f} s of a cold request")
        else:
            usage = stream_usage(client, endpoints.base_url, models[0], prompt)
            notes.append("KV events: no endpoint given")
        cached = reports_cached_tokens(usage)
        if not cached:
            notes.append("usage.prompt_tokens_details.cached_tokens missing: cached = unknown")
        families = fetch_metrics(client, endpoints.metrics_url)
    family = next((e for e in engines if families and e.owns_metrics(families)), None)
    if families is not None and family is None:
        notes.append("/metrics answers but with no known engine's metric names")
    return Capabilities(
        family=family.name if family else None,
        models=models,
        cached_tokens=cached,
        metrics=families is not None,
        kv_events=kv_events,
        capacity_tokens=family.capacity_tokens(families) if family and families else None,
        notes=tuple(notes),
    )
