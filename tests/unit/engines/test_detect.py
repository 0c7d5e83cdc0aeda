"""Capability detection against a stand-in server that serves recorded vLLM outputs."""

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import zmq
from helpers import VLLM_FIXTURES, free_port, recorded_frames, restamped

from kvscope.engines import METRIC_FAMILIES
from kvscope.engines.base import Endpoints
from kvscope.engines.detect import detect
from kvscope.engines.kv_events import decode
from kvscope.errors import EngineError


@dataclass
class StandIn:
    """Serves /v1/models, a streamed chat completion and /metrics; optionally KV events."""

    sse: str
    metrics: str | None
    publish_live: bool = False
    replay_port: int | None = None
    kv_port: int = field(default_factory=lambda: free_port(2))

    def serve(self) -> Iterator[str]:
        outer = self
        ctx = zmq.Context.instance()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, (VLLM_FIXTURES / "models.json").read_text())
                elif self.path == "/metrics" and outer.metrics is not None:
                    self._send(200, outer.metrics, "text/plain")
                else:
                    self._send(404, "{}")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                self._send(200, outer.sse, "text/event-stream")
                if outer.publish_live:
                    pub = ctx.socket(zmq.PUB)
                    pub.connect(f"tcp://127.0.0.1:{outer.kv_port}")  # like vLLM: it connects
                    time.sleep(0.3)
                    for frame in recorded_frames():
                        pub.send_multipart(restamped(frame))
                    time.sleep(0.3)
                    pub.close(linger=1000)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stop = threading.Event()
        if self.replay_port:
            threading.Thread(target=self._replay, args=(ctx, stop), daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            stop.set()
            server.shutdown()

    def _replay(self, ctx: zmq.Context, stop: threading.Event) -> None:
        router = ctx.socket(zmq.ROUTER)
        router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        while not stop.is_set():
            if router.poll(100):
                client, _, _start = router.recv_multipart()
                for frame in recorded_frames():
                    router.send_multipart([client, b"", *restamped(frame)])
                router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        router.close(linger=0)

    def endpoints(self, base_url: str, kv: bool = True) -> Endpoints:
        return Endpoints(
            base_url=base_url,
            metrics_url=f"{base_url}/metrics",
            kv_events=f"tcp://127.0.0.1:{self.kv_port}" if kv else None,
            kv_events_subscriber_binds=True,
            kv_events_replay=f"tcp://127.0.0.1:{self.replay_port}" if self.replay_port else None,
        )


SSE = (VLLM_FIXTURES / "chat_completion_stream.sse").read_text()
METRICS = (VLLM_FIXTURES / "metrics.prom").read_text()


def run(stand_in: StandIn, kv: bool = True) -> object:
    gen = stand_in.serve()
    base = next(gen)
    try:
        return detect(stand_in.endpoints(base, kv), METRIC_FAMILIES, kv_wait_s=2)
    finally:
        gen.close()


def test_recorded_frames_decode() -> None:
    kinds = [e.kind for f in recorded_frames() for e in decode(f).events]
    assert kinds.count("stored") >= 4
    assert "removed" in kinds and "cleared" in kinds


def test_everything_reported() -> None:
    caps = run(StandIn(SSE, METRICS, publish_live=True))
    assert caps.family == "vllm"
    assert caps.models == ("smollm2",)
    assert caps.cached_tokens is True
    assert caps.metrics is True
    assert caps.kv_events is True
    assert caps.capacity_tokens == 2048
    assert caps.notes == ()


def test_cached_tokens_not_reported_is_unknown_not_zero() -> None:
    sse = SSE.replace('"prompt_tokens_details":{', '"prompt_tokens_details":null,"x":{')
    assert sse != SSE
    caps = run(StandIn(sse, METRICS), kv=False)
    assert caps.cached_tokens is False
    assert any("cached = unknown" in n for n in caps.notes)


def test_no_metrics_endpoint() -> None:
    caps = run(StandIn(SSE, None), kv=False)
    assert caps.metrics is False
    assert caps.family is None
    assert caps.capacity_tokens is None
    assert caps.kv_events is None  # no endpoint: not checkable


def test_metrics_of_an_unknown_engine() -> None:
    caps = run(StandIn(SSE, "# TYPE foo_total counter\nfoo_total 3\n"), kv=False)
    assert caps.metrics is True
    assert caps.family is None
    assert any("no known engine" in n for n in caps.notes)


def test_silent_kv_endpoint() -> None:
    caps = run(StandIn(SSE, METRICS))
    assert caps.kv_events is False
    assert any("no BlockStored" in n for n in caps.notes)


def test_events_only_through_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The live socket dropped the probe's batch (as every fresh vLLM does): after a first look
    of QUICK_S the replay buffer is asked, not after all of kv_wait_s."""
    from kvscope.engines import detect as detecting

    waits: list[float] = []
    receive = detecting.receive
    monkeypatch.setattr(detecting, "receive", lambda s, t: waits.append(t) or receive(s, t))
    caps = run(StandIn(SSE, METRICS, replay_port=free_port()))
    assert caps.kv_events is True
    assert any("only through replay" in n for n in caps.notes)
    assert waits == [detecting.QUICK_S]


def test_nothing_listening() -> None:
    with pytest.raises(EngineError, match="no OpenAI-compatible server"):
        detect(Endpoints(f"http://127.0.0.1:{free_port()}", None, None), METRIC_FAMILIES)
