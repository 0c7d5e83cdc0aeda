"""The lite probe (probe/lite.py, raw_call.py, raw_rows.py): what it needs in an app's interpreter,
what it sends, what the app reads, and that its record read back by the profiling process makes
the row kvscope's own probe makes of the same call."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from vllm_stub import Stub

from kvscope.config import EngineConfig
from kvscope.engines import make_engine
from kvscope.probe import child, raw_rows
from kvscope.probe.hints import make_hints
from kvscope.probe.identity import CallIdentity
from kvscope.probe.intercept import Interceptor
from kvscope.probe.raw_call import RAW_CALLS_JSONL, RawCall
from kvscope.probe.wire import CallContext
from kvscope.records.requests import RequestRecord

BASE = "http://engine:8000"
HI = [{"role": "user", "content": "hi"}]
TIMING = ("ttft_ms", "tpot_ms", "e2e_ms", "start_ns", "end_ns", "timestamp", "request_uuid")


def _ctx(rows: list[RequestRecord]) -> CallContext:
    return CallContext("bench-1", "exp", "hash", "app", None, "smollm2", None, rows.append)


def _client(stub: Stub) -> openai.OpenAI:
    http = httpx2.Client(transport=stub.transport(httpx2))
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key="x", http_client=http, max_retries=0)


def _lite(raws: list[dict[str, Any]], kind: str = "vllm") -> Interceptor:
    template = child.wire_template(EngineConfig(kind=kind))

    def make(body: dict[str, Any], ident: Any, responses: bool) -> RawCall:
        # through JSON, as the part file carries it
        return RawCall(
            template, body, ident, responses, lambda r: raws.append(json.loads(json.dumps(r)))
        )

    return Interceptor(None, BASE, None, make_call=make)


def _call(client: openai.OpenAI, stream: bool) -> Any:
    if stream:
        made = client.chat.completions.create(model="smollm2", messages=HI, stream=True)
        return [c.model_dump() for c in made]
    return client.chat.completions.create(model="smollm2", messages=HI).model_dump()


@pytest.mark.parametrize("stream", [True, False])
def test_a_recorded_call_reads_back_as_kvscopes_own_row(stream: bool) -> None:
    engine = make_engine(EngineConfig())
    stub = Stub(delay_s=0.002)
    plain = _call(_client(stub), stream)
    own: list[RequestRecord] = []
    with Interceptor(engine, BASE, _ctx(own)):
        _call(_client(stub), stream)
    raws: list[dict[str, Any]] = []
    with _lite(raws):
        seen = _call(_client(stub), stream)
    assert _same_view(seen, plain)  # the usage chunk the probe asked for is not the app's
    _, body, headers = stub.received[-1]
    [raw] = raws
    assert (
        body["request_id"] == body["session_id"] == headers["x-request-id"] == raw["request_uuid"]
    )
    assert (body.get("stream_options") or {}).get("include_usage") is (True if stream else None)
    assert body["return_token_ids"] is True  # vLLM's exact prompt ids asked for, as kvscope's own
    assert _ids_of(raw) == Stub().prompt_ids  # ... in the engine's bytes kept, not in the app's
    rows: list[RequestRecord] = []
    raw_rows.row_of(raw, engine, _ctx(rows))
    [mine], [theirs] = rows, own
    assert mine.request_uuid == raw["request_uuid"] and mine.status == "ok"
    a, b = mine.to_dict(), theirs.to_dict()
    assert {k: v for k, v in a.items() if k not in TIMING} == {
        k: v for k, v in b.items() if k not in TIMING
    }
    assert mine.prompt_tokens is not None and mine.cached_tokens is not None
    assert (mine.ttft_ms is not None) is stream and mine.e2e_ms > 0
    if stream:
        assert 0 < mine.ttft_ms < mine.e2e_ms


def _ids_of(raw: dict[str, Any]) -> list[int] | None:
    engine = make_engine(EngineConfig())
    for _, text in raw["chunks"]:
        for line in text.encode("latin-1").splitlines():
            if line.startswith(b"data: {") or line.startswith(b"{"):
                ids = engine.reply_prompt_ids(json.loads(line.removeprefix(b"data: ")))
                if ids is not None:
                    return ids
    return None


def _same_view(seen: Any, plain: Any) -> bool:
    if isinstance(seen, list):  # ids and times differ from call to call: the chunks' content
        return [(c["choices"], c["usage"]) for c in seen] == [
            (c["choices"], c["usage"]) for c in plain
        ]
    return seen["choices"] == plain["choices"] and seen["usage"] == plain["usage"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("agent", ["planner", 'the "quoted" agent', "é", None])
def test_the_template_tags_a_call_as_the_engine_does(kind: str, agent: str | None) -> None:
    engine = make_engine(EngineConfig(kind=kind))
    template = child.wire_template(EngineConfig(kind=kind))
    assert template.tags("u-1", agent) == engine.request_tags("u-1", agent or "")


def test_a_failed_call_is_a_row_with_its_error() -> None:
    engine = make_engine(EngineConfig())
    raws: list[dict[str, Any]] = []
    with _lite(raws), pytest.raises(openai.APIConnectionError):
        _call(_client(Stub(fail=httpx2.ConnectError("refused"))), stream=True)
    with _lite(raws), pytest.raises(openai.APIStatusError):
        _call(_client(Stub(status=503)), stream=False)
    rows: list[RequestRecord] = []
    for raw in raws:
        raw_rows.row_of(raw, engine, _ctx(rows))
    assert [(r.status, r.error_type) for r in rows] == [
        ("error", "connection"),
        ("error", "http_503"),
    ]
    assert rows[0].prompt_tokens is None and rows[1].error_message == "boom"


def test_parts_are_replayed_and_removed_a_torn_line_counted(tmp_path: Path) -> None:
    engine = make_engine(EngineConfig())
    raws: list[dict[str, Any]] = []
    with _lite(raws):
        _call(_client(Stub()), stream=True)
        _call(_client(Stub()), stream=False)
    part = tmp_path / f"{RAW_CALLS_JSONL}.123"
    part.write_text("".join(json.dumps(r) + "\n" for r in raws) + '{"request_uuid": "x", "bo')
    (tmp_path / f"{RAW_CALLS_JSONL}.7").write_text(json.dumps({"not": "a call"}) + "\n")
    rows: list[RequestRecord] = []
    done = raw_rows.replay_parts(tmp_path, engine, _ctx(rows))
    assert (done.calls, done.unreadable) == (2, 2)
    assert [r.request_uuid for r in rows] == [r["request_uuid"] for r in raws]
    assert not list(tmp_path.glob(f"{RAW_CALLS_JSONL}*"))


def test_the_lite_probe_needs_nothing_but_the_standard_library(isolated_dirs: Path) -> None:
    """In an interpreter with no site-packages at all (-S), the lite probe and the identity
    readers import from the probe path alone."""
    base = getattr(sys, "_base_executable", sys.executable)
    code = (
        f"import json, sys; sys.path.append({str(child.probe_path())!r}); "
        "import kvscope.probe.lite, kvscope.probe.identity, kvscope.engines.vllm_ids, "
        "kvscope.engines.sglang_ids; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run([base, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert "kvscope" in loaded
    assert {m for m in loaded if m not in sys.stdlib_module_names} - {"__main__"} == {"kvscope"}


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_eviction_hints_are_sent_where_the_engine_has_the_lever(kind: str) -> None:
    """SGLang takes a call's priority (probe/hints.py), vLLM has no such lever: the lite probe
    sends the run's hint where the full probe would, and the row says what was sent."""
    engine = make_engine(EngineConfig(kind=kind))
    template = child.wire_template(EngineConfig(kind=kind))
    assert template.priority_field == ("priority" if kind == "sglang" else None)
    hints, raws, stub = make_hints("steps-to-execution"), [], Stub()
    ident = CallIdentity(agent_id="planner", workflow_run_id="w1")
    with Interceptor(None, BASE, None, make_call=lambda b, _i, r: RawCall(
        template, b, ident, r, raws.append, hints)):  # fmt: skip
        _call(_client(stub), stream=False)
    _, body, _ = stub.received[-1]
    rows: list[RequestRecord] = []
    raw_rows.row_of(json.loads(json.dumps(raws[0])), engine, _ctx(rows))
    if kind == "sglang":
        assert isinstance(body["priority"], int) and body["priority"] >= 2
        assert raws[0]["priority"] == rows[0].engine_priority == body["priority"]
    else:
        assert "priority" not in body and rows[0].engine_priority is None
