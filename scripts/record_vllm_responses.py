"""Record vLLM's /v1/responses replies for the unit tests (tests/fixtures/vllm-<version>/):
a non-streamed response, the exact SSE body of a streamed one (both after a warm-up call, so
`cached_tokens` > 0), a request offering a function tool with a named `tool_choice`, and a 404
error (an unknown model). Also checks that kvscope's request tags (`request_id`, `session_id`,
`priority`) are accepted there (200, and the response id is the `request_id`).

Needs an engine up on 127.0.0.1:8000 serving `smollm2` (`kvscope engine up`).

    .venv/bin/python scripts/record_vllm_responses.py [out_dir]
"""

import sys
from pathlib import Path

import httpx

from kvscope.engines.vllm import VERSION

URL = "http://127.0.0.1:8000/v1/responses"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / f"vllm-{VERSION}"
RULE = "answer politely, briefly and in plain words about the weather."
RULES = " ".join(f"Rule {i}: {RULE}" for i in range(1, 31))
BODY = {
    "model": "smollm2",
    "instructions": "You answer in one short sentence. " + RULES,
    "input": [{"role": "user", "content": "Why is the sky blue?"}],
    "max_output_tokens": 24,
    "temperature": 0,
}
TOOL = {
    "type": "function",
    "name": "lookup_invoice",
    "description": "The customer's latest invoice.",
    "parameters": {"type": "object", "properties": {}, "required": []},
}
TOOL_BODY = {
    "model": "smollm2",
    "instructions": "You answer billing questions.",
    "input": "Is my invoice paid?",
    "tools": [TOOL],
    "tool_choice": {"type": "function", "name": "lookup_invoice"},
    "max_output_tokens": 96,
    "temperature": 0,
}


def main(out: Path) -> None:
    with httpx.Client(timeout=120) as c:
        c.post(URL, json=BODY).raise_for_status()  # warm the prefix cache
        (out / "responses.json").write_bytes(c.post(URL, json=BODY).content)
        with c.stream("POST", URL, json={**BODY, "stream": True}) as s:
            (out / "responses_stream.sse").write_bytes(b"".join(s.iter_raw()))
        (out / "responses_tool_call.json").write_bytes(c.post(URL, json=TOOL_BODY).content)
        tags = {"request_id": "tagged-1", "session_id": "tagged-1", "priority": 0}
        tagged = c.post(URL, json=BODY | tags)
        print("tags:", tagged.status_code, "response id:", tagged.json().get("id"))
        error = c.post(URL, json={**BODY, "model": "nope"})
        print("unknown model:", error.status_code)
        (out / "responses_error.json").write_bytes(error.content)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
