"""Capability detection: what a running engine actually reports, seen with one probe request."""

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx
import msgpack
import zmq
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kvscope.engines.base import Capabilities, Endpoints, Engine
from kvscope.errors import EngineError

# Long enough to fill whole KV blocks (vLLM CPU: 128 tokens), so that a store event must follow.
_FILLER = " ".join(f"ledger line {i} stays stable." for i in range(80))


def parse_metrics(text: str) -> list[Metric]:
    return list(text_string_to_metric_families(text))


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


@contextmanager
def kv_subscriber(endpoint: str, bind: bool) -> Iterator[zmq.Socket]:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
        yield sock
    finally:
        sock.close()


def decode_frames(frames: Sequence[bytes]) -> tuple[int, float, list]:
    """[topic, 8-byte big-endian seq, msgpack [ts, events, dp_rank]] -> (seq, ts, events)."""
    if len(frames) != 3:
        raise ValueError(f"expected 3 frames, got {len(frames)}")
    seq = int.from_bytes(frames[1], "big", signed=True)
    batch = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("payload is not a KV event batch [ts, events, ...]")
    return seq, float(batch[0]), batch[1]


Batch = tuple[int, float, list]  # (seq, ts, events)


def receive(sock: zmq.Socket, timeout_s: float) -> list[Batch]:
    """Batches until `timeout_s` passes, or 100 ms of quiet once something arrived."""
    batches: list[Batch] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(100):
            try:
                batches.append(decode_frames(sock.recv_multipart()))
            except ValueError:
                continue
        elif batches:
            break
    return batches


def wait_for_events(sock: zmq.Socket, timeout_s: float) -> list:
    return [e for _, _, events in receive(sock, timeout_s) for e in events]


def replay(endpoint: str, start_seq: int = 0, timeout_s: float = 3.0) -> list[Batch]:
    """Batches from seq `start_seq` on, from the engine's replay (ROUTER) socket."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[Batch] = []
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        while sock.poll(int(timeout_s * 1000)):
            frames = sock.recv_multipart()[1:]  # drop the empty delimiter
            if len(frames) == 3 and int.from_bytes(frames[1], "big", signed=True) == -1:
                break  # end-of-replay marker
            try:
                out.append(decode_frames(frames))
            except ValueError:
                continue
    finally:
        sock.close()
    return out


def _stored(events: list) -> bool:
    return any(isinstance(e, dict) and e.get("type") == "BlockStored" for e in events)


def detect(
    endpoints: Endpoints,
    engines: Sequence[type[Engine]],
    *,
    timeout_s: float = 60.0,
    kv_wait_s: float = 5.0,
) -> Capabilities:
    """Probe a running engine: models, cached-token reporting, /metrics, KV events."""
    notes: list[str] = []
    with httpx.Client(timeout=timeout_s) as client:
        models = list_models(client, endpoints.base_url)
        if not models:
            raise EngineError(f"{endpoints.base_url}/v1/models lists no model")
        prompt = f"[{uuid.uuid4()}] {_FILLER} Say ok."  # unique head: never a cache hit
        kv_events: bool | None = None
        if endpoints.kv_events:
            try:
                with kv_subscriber(endpoints.kv_events, endpoints.kv_events_subscriber_binds) as s:
                    time.sleep(0.5)  # let the PUB/SUB link form before anything is published
                    sent = time.time()
                    usage = stream_usage(client, endpoints.base_url, models[0], prompt)
                    kv_events = _stored(wait_for_events(s, kv_wait_s))
            except zmq.ZMQError as err:
                raise EngineError(f"KV events endpoint {endpoints.kv_events}: {err}") from None
            if not kv_events and endpoints.kv_events_replay:
                # A publisher's first batch after a subscriber joins can be dropped on the live
                # socket (seen on vLLM); its replay buffer still holds it.
                batches = replay(endpoints.kv_events_replay)
                kv_events = any(ts >= sent - 1 and _stored(ev) for _, ts, ev in batches)
                if kv_events:
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
