"""A stand-in OpenAI-compatible engine that answers at once, for benchmarks of kvscope's own cost.

    .venv/bin/python bench/standin_engine.py --port 8123 [--port 8124 ...]

Serves vLLM 0.32.0's recorded replies (tests/fixtures/vllm-0.32.0, as tests/vllm_stub.py does,
but over real HTTP from a process of its own, so that it does not share the profiled app's GIL):
POST /v1/chat/completions streams the recorded SSE body (the usage chunk only when the request
asks for it with stream_options.include_usage, as vLLM does) or returns the recorded JSON; GET
/v1/models, /health and /metrics (the recorded Prometheus text). No model runs: every reply is
bytes prepared at start, sent in one write. Each port given is one listener of the same server;
"ready" is printed once all listen.
"""

import argparse
import asyncio
import json
from pathlib import Path

from aiohttp import web

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.32.0"
SSE = (FIXTURES / "chat_completion_stream.sse").read_text()
EVENTS = [e + "\n\n" for e in SSE.split("\n\n") if e.strip()]
WITH_USAGE = "".join(EVENTS).encode()
WITHOUT_USAGE = "".join(e for e in EVENTS if '"usage":{' not in e).encode()
REPLY = (FIXTURES / "chat_completion.json").read_bytes()
MODELS = (FIXTURES / "models.json").read_bytes()
METRICS = (FIXTURES / "metrics.prom").read_bytes()
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def chat(request: web.Request) -> web.StreamResponse:
    body = json.loads(await request.read())
    if not body.get("stream"):
        return web.Response(body=REPLY, content_type="application/json")
    usage = (body.get("stream_options") or {}).get("include_usage")
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    await response.write(WITH_USAGE if usage else WITHOUT_USAGE)
    await response.write_eof()
    return response


async def models(_: web.Request) -> web.Response:
    return web.Response(body=MODELS, content_type="application/json")


async def health(_: web.Request) -> web.Response:
    return web.Response(body=b"")


async def metrics(_: web.Request) -> web.Response:
    return web.Response(body=METRICS, content_type="text/plain", charset="utf-8")


def app() -> web.Application:
    application = web.Application()
    application.add_routes(
        [
            web.post("/v1/chat/completions", chat),
            web.get("/v1/models", models),
            web.get("/health", health),
            web.get("/metrics", metrics),
        ]
    )
    return application


async def serve(ports: list[int]) -> None:
    runner = web.AppRunner(app(), access_log=None)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, action="append", required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
