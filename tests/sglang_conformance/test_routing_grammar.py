"""SGLang 0.5.23's own request model and xgrammar backend on kvscope's routing decisions.

The dynamic workloads route by structured output (kvscope.workload.decisions): the request body
kvscope sends must reach SGLang's grammar as the string enum, and that grammar must let the
model write exactly one choice, nothing else. Opt-in (`-m sglang`); runs SGLang in
routing_grammar_probe.py with its own interpreter; skipped without the SmolLM2 tokenizer.
"""

import json
import subprocess
from pathlib import Path

import pytest

from kvscope.engines.model import model_dir
from kvscope.workload import decisions

pytestmark = pytest.mark.sglang

PROBE = Path(__file__).with_name("routing_grammar_probe.py")
CHOICES = ["planner", "executor", "end"]


def test_sglang_constrains_a_route_to_exactly_one_choice(sglang_interpreter: Path) -> None:
    tokenizer = model_dir()
    if not (tokenizer / "tokenizer.json").exists():
        pytest.skip(f"no SmolLM2 tokenizer at {tokenizer}; run scripts/setup.sh")
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Decide the next step."}],
        "max_tokens": decisions.ROUTE_MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "response_format": decisions.choice_format(CHOICES),
    }
    wrong = ['"plan"', "planner", '"planner" ', '"writer"', '{"next": "end"}', '"end""end"']
    job = {
        "body": body,
        "tokenizer": str(tokenizer),
        "replies": [*map(json.dumps, CHOICES), *wrong],
    }
    done = subprocess.run(
        [str(sglang_interpreter), str(PROBE)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PROBE.parent,
    )
    if "No module named 'xgrammar'" in done.stderr:
        pytest.skip("SGLang's grammar backend (xgrammar) is not installed in its venv")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert json.loads(got["json_schema"]) == {"type": "string", "enum": CHOICES}
    assert got["max_new_tokens"] == decisions.ROUTE_MAX_TOKENS
    for choice in CHOICES:
        assert got["replies"][json.dumps(choice)] == {"accepted": True, "ends": True}, choice
    for reply in wrong:
        assert got["replies"][reply]["ends"] is False, reply
