"""Each call placed on the replica that served it (finalize.replicas): vLLM replicas from their logs
and KV events; SGLang replicas behind sglang-router from what the replicas wrote
(tests/fixtures/sglang-0.5.23/router/, recorded live: two replicas, round_robin then cache_aware;
its README names each call's replica, read from the router's debug log). The router drops
kvscope's rid and session_id: a replica names each call with a rid of its own, and logs the
x-request-id header beside it (SGLANG_LOG_REQUEST_HEADERS, set by engines.deployment).
finalize.replicas places a call by that header, else by the reply's id."""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import SGLANG_FIXTURES
from test_deployment_tables import full

from kvscope.config import DeploymentConfig, EngineConfig
from kvscope.engines import deployment
from kvscope.engines.base import REQUEST_ID_HEADER
from kvscope.engines.sglang import LABEL_HEADER, SglangEngine
from kvscope.finalize import finalize, replicas
from kvscope.records import requests
from kvscope.records.run_dir import SGLANG_REQUEST_LOGS, SGLANG_REQUEST_METRICS, replica_dir

ROUTER = SGLANG_FIXTURES / "router"
# the calls of the recording: x-request-id -> (the replica that served it, its rid there)
SERVED = {
    "kvs-uuid-ns1": ("r0", "9a9dfb724f844da9a2ae83e15e4e939b"),
    "kvs-uuid-ns2": ("r1", "51bb9bbabcc5405eb1747076bec80fbd"),
    "kvs-uuid-s3": ("r0", "1f1fcaf5997c4073b3c33e28ceb167d4"),
    "kvs-uuid-s4": ("r1", "66d67eb763134d01809bec05cc628bcd"),
    "kvs-uuid-ca5": ("r1", "d13d59de19414eaa9bf0ba22a7ab3dfa"),
    "kvs-uuid-ca6": ("r1", "551fc330143a441aa1d8c4bf7d247337"),
}
WARMUP = {"r0": "fe2ead9ec5d74f97b5186a66286af330", "r1": "b6e2d5819e49410787229fbd4c8e69d9"}


def request_log(name: str) -> list[str]:
    return (ROUTER / f"{name}_request_log.log").read_text().splitlines()


@pytest.fixture(scope="module")
def seen() -> dict[str, dict[str, str | None]]:
    return {name: replicas.sglang_requests(request_log(name)) for name in ("r0", "r1")}


def test_a_request_log_names_each_rid_with_its_header(
    seen: dict[str, dict[str, str | None]],
) -> None:
    for uuid, (name, rid) in SERVED.items():
        assert seen[name][rid] == uuid
    # the warm-up call and the router's health checks: rids without a header
    assert seen["r0"][WARMUP["r0"]] is None
    checks = [rid for rid in seen["r1"] if rid.startswith("HEALTH_CHECK_")]
    assert len(checks) == 4 and all(seen["r1"][c] is None for c in checks)
    assert len(seen["r0"]) == 7 and len(seen["r1"]) == 9  # received + finished: one rid each


def test_other_lines_are_skipped() -> None:
    line = request_log("r0")[-1]
    lines = ["INFO:     127.0.0.1:52730 - GET /health 200 OK", line[: len(line) // 2], "", line]
    assert len(replicas.sglang_requests(lines)) == 1  # the torn copy and the access log: none


def test_every_call_is_placed_by_its_header(seen: dict[str, dict[str, str | None]]) -> None:
    rows = [{"request_uuid": u, "sglang_response_id": None} for u in SERVED]
    assert replicas.from_sglang_logs(seen, rows) == {u: r for u, (r, _) in SERVED.items()}


def test_without_the_header_the_reply_id_places_the_call(
    seen: dict[str, dict[str, str | None]],
) -> None:
    bare = {name: dict.fromkeys(s) for name, s in seen.items()}  # logged without headers
    rows = [{"request_uuid": u, "sglang_response_id": rid} for u, (_, rid) in SERVED.items()]
    rows += [{"request_uuid": "lost", "sglang_response_id": None},  # no reply: unknown
             {"request_uuid": "other", "sglang_response_id": "0" * 32}]  # fmt: skip
    got = replicas.from_sglang_logs(bare, rows)
    assert got == {u: r for u, (r, _) in SERVED.items()} | {"lost": None, "other": None}


def test_a_call_two_replicas_name_is_not_placed(seen: dict[str, dict[str, str | None]]) -> None:
    retried = {"r0": dict(seen["r0"]), "r1": seen["r1"]}
    retried["r0"]["f" * 32] = "kvs-uuid-ns2"  # the router retried it on r0 too
    rows = [{"request_uuid": "kvs-uuid-ns2", "sglang_response_id": SERVED["kvs-uuid-ns2"][1]}]
    assert replicas.from_sglang_logs(retried, rows) == {"kvs-uuid-ns2": None}


def test_only_the_header_crosses_the_router() -> None:
    """What SglangEngine tags a call with, against what the router passed on to a worker: of
    the tags, only the x-request-id header arrives (the body fields and the label are lost)."""
    body, headers = SglangEngine(EngineConfig(kind="sglang")).request_tags("u1", "planner")
    assert headers == {REQUEST_ID_HEADER: "u1", LABEL_HEADER: '{"agent":"planner"}'}
    for line in (ROUTER / "forwarded_to_worker.jsonl").read_text().splitlines():
        sent = json.loads(line)
        assert set(headers) & set(sent["headers"]) == {REQUEST_ID_HEADER}
        assert set(body) & set(sent["body"]) == set()
        assert "return_input_ids_in_sglext" not in sent["body"]
    _, unnamed = SglangEngine(EngineConfig(kind="sglang")).request_tags("u2", "")
    assert unnamed == {REQUEST_ID_HEADER: "u2"}


def test_sglang_replicas_log_the_header_in_their_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kvscope.engines.sglang.gpu_present", lambda: False)
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    env = {"SGLANG_LOG_REQUEST_HEADERS": "x-smg-routing-key", "OTHER": "1"}
    engine = EngineConfig(kind="sglang", model="/m", env=env)
    engines = deployment.replica_engines(DeploymentConfig(), engine, tmp_path)
    for name, e in zip(("r0", "r1"), engines, strict=True):
        launch = e.launch()
        assert launch is not None
        argv, got = list(launch.argv), dict(launch.env)
        assert got["SGLANG_LOG_REQUEST_HEADERS"] == "x-smg-routing-key,x-request-id"
        assert got["OTHER"] == "1"
        folder = replica_dir(tmp_path, name)
        assert argv[argv.index("--log-requests-target") + 1] == str(folder / SGLANG_REQUEST_LOGS)
        exported = argv[argv.index("--export-metrics-to-file-dir") + 1]
        assert exported == str(folder / SGLANG_REQUEST_METRICS)
        assert "--log-requests-format" in argv
    # without a run directory (a dry look at the commands): the header, no folder of their own
    plain = deployment.replica_configs(DeploymentConfig(), EngineConfig(kind="sglang"))
    assert [c.output_dir for c in plain] == [None, None]
    assert plain[1].env == {"SGLANG_LOG_REQUEST_HEADERS": REQUEST_ID_HEADER}
    vllm = deployment.replica_configs(DeploymentConfig(), EngineConfig(), tmp_path)
    assert [(c.output_dir, c.env) for c in vllm] == [(None, {}), (None, {})]


def row(uuid: str, reply: str | None, start: int) -> dict[str, Any]:
    return full({
        "request_uuid": uuid, "workflow_run_id": "w1", "agent_id": "planner",
        "start_ns": start, "end_ns": start + 9, "status": "ok", "prompt_tokens": 46,
        "cached_tokens": 0, "sglang_response_id": reply,
    })  # fmt: skip


def test_finalize_places_every_call_and_joins_the_replicas_exports(tmp_path: Path) -> None:
    """A deployment run directory as a run writes it (the recorded logs and exports in each
    replica's folder): every call placed, its exported timings joined through its rid."""
    rows = [row(u, rid, i) for i, (u, (_, rid)) in enumerate(SERVED.items())]
    rows[0]["sglang_response_id"] = None  # a reply without its id: the header still places it
    rows.append(row("kvs-uuid-lost", None, 99))  # in no log (refused by the router, say)
    with (tmp_path / requests.REQUESTS_JSONL).open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    for name in ("r0", "r1"):
        folder = replica_dir(tmp_path, name)
        for sub, kind in ((SGLANG_REQUEST_LOGS, "log"), (SGLANG_REQUEST_METRICS, "metrics")):
            (folder / sub).mkdir(parents=True)
            shutil.copy(ROUTER / f"{name}_request_{kind}.log", folder / sub / "vm_0.log")
    done = finalize(tmp_path)
    got = {r["request_uuid"]: r for r in requests.load_table(tmp_path).to_pylist()}
    assert {u: r["replica"] for u, r in got.items()} == {
        **{u: name for u, (name, _) in SERVED.items()}, "kvs-uuid-lost": None,
    }  # fmt: skip
    ns1 = got["kvs-uuid-ns1"]  # r0's export: queue 0.93 ms, forward 1795818435.034219 ->
    # prefill done .265167 -> finished .3928554
    assert ns1["queue_ms"] == pytest.approx(0.9325, abs=1e-3)
    assert ns1["prefill_ms"] == pytest.approx(230.948, abs=1e-2)
    assert ns1["decode_ms"] == pytest.approx(127.688, abs=1e-2)
    assert all(got[u]["prefill_ms"] is not None for u in SERVED)
    assert got["kvs-uuid-lost"]["queue_ms"] is None
    assert done.rows == len(rows)


# --- vLLM replicas: from their logs and KV events ---

A, B, C, D = (f"{c * 8}-1111-4111-8111-{c * 12}" for c in "abcd")
LOGS = {
    # as vLLM 0.32 writes them with --enable-log-requests (the suffix is vLLM's own)
    "r0": f"(APIServer pid=25170) INFO 11-24 21:46:24 [async_llm.py:578] Added request "
    f"chatcmpl-{A}-a29d9626.\n"
    f"(APIServer pid=25170) INFO 11-24 21:46:26 [async_llm.py:578] Added request chatcmpl-{C}.\n"
    f"(APIServer pid=25170) INFO 11-24 21:46:27 [logger.py:66] Received request chatcmpl-{B}: "
    "params: ...\n",
    "r1": f"(APIServer pid=25171) INFO 11-24 21:46:22 [async_llm.py:578] Added request "
    f"chatcmpl-{B}-9e7360fe.\n"
    f"(APIServer pid=25171) INFO 11-24 21:46:26 [async_llm.py:578] Added request chatcmpl-{C}.\n",
}


def test_vllm_from_logs() -> None:
    got = replicas.from_logs(LOGS, [A, B, C, D])
    # B is only *received* on r0 (never added there); C was added on both: unknown
    assert got == {A: "r0", B: "r1", C: None, D: None}


def test_vllm_from_kv_events() -> None:
    got = replicas.from_kv_events({"r0": [A, None, A], "r1": [B, C], "r2": [C]}, [A, B, C, D])
    assert got == {A: "r0", B: "r1", C: None, D: None}
