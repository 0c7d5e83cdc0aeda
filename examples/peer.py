"""Run the shipped PEER app (Planner -> Executor -> Expresser -> Reviewer, LangGraph) against an
OpenAI-compatible engine, as an ordinary app: nothing here knows about profiling.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 KVSCOPE_MODEL=smollm2 python examples/peer.py
    kvscope profile -- python examples/peer.py      # the same app, every call a request row

The engine comes from the environment: OPENAI_BASE_URL (`.../v1`), OPENAI_API_KEY (any value for a
local engine), KVSCOPE_MODEL (the served model name; default: the engine's first model).
Optional arguments: the number of workflows and how many run at once (default 4 and 2).
"""

import argparse
import asyncio
import os
import sys

import openai

from kvscope.config import WorkloadConfig
from kvscope.workload.driver import run_workflows


async def served_model(base_url: str) -> str:
    """The engine's first model, for when KVSCOPE_MODEL is not set."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "x"))
    try:
        models = await client.models.list()
        return models.data[0].id
    finally:
        await client.close()


async def main(workflows: int, concurrency: int) -> int:
    base_url = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    model = os.environ.get("KVSCOPE_MODEL") or await served_model(base_url)
    cfg = WorkloadConfig(workflows=workflows, concurrency=concurrency, cycles=2, max_tokens=32)
    results = await run_workflows(base_url, model, cfg, thread_prefix="example")
    failed = [r.thread_id for r in results if not r.ok]
    calls = sum(r.calls for r in results)
    print(
        f"peer: {len(results)} workflows, {calls} calls, "
        f"{sum(r.cycles for r in results)} cycles, {len(failed)} failed {failed or ''}".rstrip()
    )
    return 1 if failed else 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workflows", type=int, nargs="?", default=4, help="default 4")
    parser.add_argument("concurrency", type=int, nargs="?", default=2, help="at once, default 2")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    sys.exit(asyncio.run(main(args.workflows, args.concurrency)))
