"""vllm-router (PyPI `vllm-router`): its command line, as kvscope launches it (engines.router).

vllm-router is a Rust binary wheel (0.1.17: `vllm_router_rs.abi3.so` plus a Python launcher,
the `vllm-router` console script); install it with `pip install 'kvscope[router]'` into
kvscope's environment (found next to kvscope's Python) or anywhere on PATH, or name the program
in `deployment.router.executable`. Flags, from `vllm-router --help` (0.1.17):

- `--worker-urls URL ...` the replicas; `--policy` random | round_robin | cache_aware (default)
  | kv_aware | power_of_two | consistent_hash | sticky_least_loaded; `--host`, `--port` (30000).
- `--prometheus-host`, `--prometheus-port` (29000): the router's own /metrics.
- `--request-id-headers H ...`: the headers it reads a request id from (x-request-id here).
- kv_aware only: `--kv-event-source WORKER_URL=ENDPOINT` per replica (ZMQ, the router
  subscribes: the engine's publisher must bind, see VllmEngine.shared_kv_events),
  `--kv-event-replay-source WORKER_URL=ENDPOINT`, `--kv-event-block-size` (default 16: it must
  be the engine's block size, 128 on the embedded vLLM CPU), `--kv-event-model`.
- `--worker-startup-check-interval` (default 30 s) and `--worker-startup-timeout-secs` (600):
  the router serves nothing, /health included, until every worker answers its /health, and
  exits when the timeout passes (checked: "Timeout 5s waiting for hosts [...] to become
  healthy"); kvscope starts it after the replicas are healthy, with 1 s and the router's
  startup_timeout_s. `--log-level`.

Health: GET /health on the router's port: once it answers, every worker is registered.

Seen on a real run (bench/router_probe.py, 2026-11-24: two embedded vLLM CPU replicas with
kv_capacity_tokens 4096, vllm-router 0.1.17 round_robin, 4 chat calls of 266 prompt tokens on a
busy 2-core machine; both replicas healthy after 70.5 s, all 9 processes gone and the 8 ports
free after the stop, 78 s in all):

- What tells the serving replica. The reply does not: its headers are the replica's own plus
  `x-request-id` echoed, its body the replica's (id `chatcmpl-<request_id>`, the same on every
  replica). The router logs nothing per request at info level. The router forwards the body
  unchanged (kvscope's `request_id` and `session_id` fields arrive) and the x-request-id
  header, so the replicas say it: with `--enable-log-requests` each logs `Added request
  chatcmpl-<request_id>-<8 hex>.` (finalize.replicas.from_logs: all 4 calls placed); the
  BlockStored events carry session_id = the request_uuid, which places only the calls that
  stored a block (2 of 4 here: the two fully cached calls stored none).
- The router's /metrics (its --prometheus-port) counts per worker URL:
  `vllm_router_policy_decisions_total{policy,worker}`, `vllm_router_processed_requests_total
  {worker}`, `vllm_router_worker_health{worker}`, `vllm_router_cb_state{worker}`,
  `vllm_router_requests_total{route}` (2 + 2 decisions for the 4 calls).
- round_robin started with the second worker URL (its "Router ready" line lists them in another
  order than --worker-urls): calls went r1, r0, r1, r0.
- The second call (the other agent, same 128-token first block, on the other replica) computed
  that block again: finalize.routing_misses counted 128 routing-miss tokens, cached on r1.
- kv_aware (same calls, --kv-event-block-size 128, --kv-event-model smollm2): the router's
  subscribers connected to both replicas' bound publishers ("kv_index subscriber for <url> rank0
  on tcp://127.0.0.1:<port>") beside kvscope's own replay of the same streams; all 4 calls went
  to r0, the second got its shared block (128 cached), routing misses 0; r1 carried nothing.
  Its /metrics had no policy_decisions_total sample; processed / cb_outcomes per worker remain.
"""

from collections.abc import Sequence
from typing import Any

from kvscope.config import RouterConfig
from kvscope.engines import router_flags
from kvscope.engines.router_flags import Replica
from kvscope.errors import ConfigError

PACKAGE = "vllm-router"
VERSION = "0.1.17"  # the version the flags above were read from
PROGRAM = "vllm-router"
INSTALL = "pip install 'kvscope[router]'"
HEALTH_PATH = "/health"  # 200 only once every worker answered its /health
WORKERS_PATH: str | None = None  # nothing more to wait for once /health answers
DROPPED_FIELDS: frozenset[str] = frozenset()  # the body is forwarded as sent


def arguments(
    config: RouterConfig, replicas: Sequence[Replica], block_size: int | None, model: str | None
) -> list[str]:
    """The flags after the program (extra_args not included). kv_aware needs every replica's KV
    event endpoint and the engine's block size."""
    argv = [*router_flags.shared(config, replicas), "--log-level", "info"]
    if config.policy == "kv_aware":
        missing = [r.name for r in replicas if not r.kv_events]
        if missing or block_size is None:
            raise ConfigError(
                "router policy kv_aware needs each replica's KV events and the block size "
                f"(missing events: {', '.join(missing) or 'none'}; block size: {block_size})"
            )
        for r in replicas:
            argv += ["--kv-event-source", f"{r.base_url}={r.kv_events}"]
            if r.kv_events_replay:
                argv += ["--kv-event-replay-source", f"{r.base_url}={r.kv_events_replay}"]
        argv += ["--kv-event-block-size", str(block_size)]
        if model:
            argv += ["--kv-event-model", model]
    return argv


def registered(listing: Any, urls: Sequence[str]) -> bool:
    """Unused (WORKERS_PATH is None): /health answers only once every worker is up."""
    return True
