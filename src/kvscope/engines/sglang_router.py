"""sglang-router (PyPI `sglang-router`, "SGLang Model Gateway"): its command line, as kvscope
launches it (engines.router), and what it does in front of vLLM and of SGLang replicas.

A Rust binary wheel (0.3.2: `sglang_router/sglang_router_rs.abi3.so`, deps aiohttp, fastapi,
uvicorn, orjson, setproctitle) with three console scripts for one CLI, `sglang-router`, `smg`
and `amg` (`sglang_router.cli:main`; also `python -m sglang_router`). It installs cleanly beside
kvscope and vllm-router (`pip install 'kvscope[sglang-router]'`; checked in a fresh venv with
`pip install -e '.[router]' sglang-router==0.3.2`, then `pip check`: no broken requirements).
The router is its `launch` subcommand (`server` starts SGLang workers too). Flags, from
`sglang-router launch --help` (0.3.2):

- `--worker-urls URL ...`; `--policy` random | round_robin | cache_aware (default) |
  power_of_two | manual (`bucket` is a --prefill-policy of PD mode only); `--host` (0.0.0.0),
  `--port` (30000); `--prometheus-host` (0.0.0.0), `--prometheus-port` (29000);
  `--request-id-headers H ...`; `--log-level` debug | info | warn | error.
- `--worker-startup-timeout-secs` (1800), `--worker-startup-check-interval` (30),
  `--health-check-endpoint` (/health), `--health-check-interval-secs` (60),
  `--shutdown-grace-period-secs` (180: kvscope gives 10, below ServerProcess's 20 s grace).
- cache_aware's `--cache-threshold`, `--balance-abs-threshold`, `--balance-rel-threshold`;
  manual's `--assignment-mode` and `--max-idle-secs`. No KV-event flags: kv_aware,
  consistent_hash and sticky_least_loaded are vllm-router's (config refuses them here).
- `--backend sglang | openai` (default sglang). openai was tried in front of two stand-in
  workers: every call went to the first worker whatever the policy, x-request-id was not
  forwarded, and the body was rewritten as below; kvscope keeps the default.

Health. The router serves /health (200) at once, before any worker is registered ("Router ready
| workers: []"): it registers them in the background (probes each worker's /health, then
/model_info and /get_model_info, 404 on vLLM: model id "unknown", harmless). /readiness answers
503 `{"status":"not ready","reason":"insufficient healthy workers"}` until one worker is
registered, then 200 `{"healthy_workers":N,"total_workers":N}` counting registered workers only.
A worker that never comes up fails its AddWorker job after --worker-startup-timeout-secs
("Failed job: type=AddWorker ... Both HTTP and gRPC health checks failed") and the router stays
up without it (/readiness 200 with 1 of 1 when one of two URLs was dead). So kvscope waits for
/readiness, then for GET /workers to list every replica URL `is_healthy` (2 s on a real run).

Seen on a real run (2026-11-25: two embedded vLLM CPU replicas, SmolLM2-135M, kv_capacity_tokens
4096, started with engines.deployment's replica engines; sglang-router 0.3.2 in its own venv,
`sglang-router launch --host 127.0.0.1 --port P --worker-urls U0 U1 --policy round_robin
--prometheus-host 127.0.0.1 --prometheus-port M --request-id-headers x-request-id
--worker-startup-check-interval 1 --worker-startup-timeout-secs 60 --log-level info`; chat
calls of 266 prompt tokens, header x-request-id and body request_id = a uuid):

- It routes to vLLM: every call 200, vLLM's reply passed through. round_robin went r1, r0, r1,
  r0 (like vllm-router, from the second URL); cache_aware sent all 4 calls to one replica;
  manual with header `x-smg-routing-key: agent<i>` kept each agent on its replica (metrics
  branch vacant 2, occupied_hit 4; without it every call is branch no_routing_id: 8 calls on
  two stand-in workers went 2 + 6);
  power_of_two worked but logs "No loads fetched from workers" (vLLM has no /get_load).
- The router rewrites the body: it parses it into SGLang's ChatCompletionRequest and sends that
  (seen on a stand-in worker): fields it does not know are DROPPED, kvscope's `request_id`,
  `session_id` and vLLM's `return_token_ids` included, and SGLang defaults are added
  (`no_stop_trim`, `ignore_eos`, `continue_final_message`, `skip_special_tokens`,
  `separate_reasoning`, `stream_reasoning`, `return_hidden_states`; vLLM accepts them). The
  `x-request-id` header (and `authorization`) is forwarded. Hence behind this router: vLLM
  replies carry no prompt_token_ids (rows fall back to the tokenizer's ids), BlockStored events
  carry no session_id (finalize.replicas.from_kv_events places nothing), and a replica's log
  names the call only where the call carried an x-request-id header (vLLM then takes it as the
  request id: `Added request chatcmpl-<x-request-id>-<8 hex>`, all calls placed by from_logs).
  kvscope's probe therefore sends the request_uuid as the x-request-id header too
  (VllmEngine.request_tags; tests/integration/test_sglang_router.py: a call with the body field
  alone is placed nowhere).
- The reply tells no replica: headers are the replica's plus x-request-id echoed and CORS ones.
  At --log-level debug the router logs `Sending request url=<worker URL>` in the call's span
  (`request_id="<x-request-id>"`); at info only the start and end of each call.
- /metrics (--prometheus-port), per worker URL: `smg_worker_cb_outcomes_total{worker,outcome}`
  (the calls each served: 2 + 2 for round_robin), `smg_worker_health{worker}`,
  `smg_worker_cb_state{worker}`, `smg_worker_cb_consecutive_{successes,failures}{worker}`,
  manual's `smg_worker_routing_keys_active{worker}`; not per worker:
  `smg_worker_selection_total{worker_type,connection_mode,model,policy}`,
  `smg_router_requests_total{router_type,backend_type,connection_mode,model,endpoint,streaming}`,
  `smg_http_requests_total{method,path}`, `smg_manual_policy_branch_total{branch}`,
  `smg_router_request_duration_seconds`, `smg_worker_pool_size`.
- SIGTERM: the router exits within about 2 s when no call is in flight.
- tests/integration/test_sglang_router.py does the above with the router command of
  engines.deployment in front of the vLLM replica pair the router tests share (round robin, then
  a second router with manual and one routing key per agent).

Seen in front of SGLang 0.5.23 replicas (2026-11-27: two CPU-engine replicas, SmolLM2-135M,
the flags above with --policy round_robin, then cache_aware; recorded in
tests/fixtures/sglang-0.5.23/router/, see its README):

- What reaches the replica: the headers content-type, accept, host and x-request-id, nothing
  else (x-custom-labels, x-override-rid, x-sglext-return-input-ids, x-kvscope-*: dropped), and
  the rebuilt body: `rid`, `session_id`, `return_input_ids_in_sglext`, `request_id` and `user`
  dropped (`metadata` is kept, but SGLang's ChatCompletionRequest has no such field), max_tokens
  sent as max_completion_tokens. So SGLang names the call with a rid of its own (32 hex), its
  KV events carry no session_id, its reply no `sglext.input_ids` (prompt ids come from the
  tokenizer), and its metrics no `agent` label (every call counts under agent="").
- SGLang 0.5.23 reads no x-request-id (its source names none) and takes x-override-rid only
  under SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES, a header the router drops anyway; but its JSON
  request log names the headers listed in SGLANG_LOG_REQUEST_HEADERS beside its rid
  (`"headers": {"x-request-id": ...}`, on request.received and request.finished). kvscope
  sends the request_uuid as x-request-id (SglangEngine.request_tags) and launches each replica
  with that variable and its own output_dir (engines.deployment): finalize.replicas places
  every call by it (4 of 4 calls, round_robin r0, r1, r0, r1; cache_aware 2 of 2 on one
  replica), and the replica's metrics export (keyed by its rid) joins through it. Through
  `kvscope run` (configs/router-sglang.yaml, 2 workflows): 16 of 16 calls placed under each
  policy, 8 per replica as the router's smg_worker_cb_outcomes_total counted, and each
  replica's prompt and cached token counters equal to the calls placed on it.
- SGLang's top-level `priority` (kvscope's eviction hints) is dropped too: `kvscope run` with
  `eviction_hints: steps-to-execution` through it (2026-11-28, two replicas on the priority
  policy) sent 122-128 with the calls, and every request.received in the replicas' request logs
  read `"priority": null`. kvscope warns at the start of such a run (target.hints_unheeded).
- The reply passes through: its `id` (and each chunk's) is the replica's rid, so a call also
  names its replica by sglang_response_id where its request log lacks the header.
"""

from collections.abc import Sequence
from typing import Any

from kvscope.config import RouterConfig
from kvscope.engines import router_flags
from kvscope.engines.router_flags import Replica

PACKAGE = "sglang-router"
VERSION = "0.3.2"  # the version the flags and behaviour above were read from
PROGRAM = "sglang-router"  # also installed as `smg` and `amg`
INSTALL = "pip install 'kvscope[sglang-router]'"
HEALTH_PATH = "/readiness"  # 503 until a worker is registered (/health: 200 at once)
WORKERS_PATH: str | None = "/workers"  # then wait for every replica there
# The rebuilt body loses these (seen above; `priority` on 2026-11-28: kvscope run with
# eviction_hints through it, each replica's request log read `"priority": null` on every call)
DROPPED_FIELDS = frozenset(
    {"rid", "session_id", "return_input_ids_in_sglext", "request_id", "user", "priority"}
)
ROUTING_KEY_HEADER = "x-smg-routing-key"  # policy manual: calls with one key stay on one worker
SHUTDOWN_GRACE_S = 10


def arguments(
    config: RouterConfig, replicas: Sequence[Replica], block_size: int | None, model: str | None
) -> list[str]:
    """The `launch` subcommand and its flags (extra_args not included). The router hashes no
    KV events: block size and model are not used."""
    return [
        "launch",
        *router_flags.shared(config, replicas),
        "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_S),
        "--log-level", "info",
    ]  # fmt: skip


def registered(listing: Any, urls: Sequence[str]) -> bool:
    """Whether GET /workers (`listing`, its JSON) shows every URL in `urls` healthy."""
    workers = listing.get("workers") if isinstance(listing, dict) else None
    if not isinstance(workers, list):
        return False
    healthy = {
        str(w.get("url", "")).rstrip("/")
        for w in workers
        if isinstance(w, dict) and w.get("is_healthy") is True
    }
    return {u.rstrip("/") for u in urls} <= healthy
