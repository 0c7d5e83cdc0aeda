"""Two embedded vLLM replicas behind the real vllm-router: what tells the serving replica?

Starts the deployment with kvscope.engines.deployment (replicas, then the router), sends a few
chat requests through the router (each with an x-request-id header and kvscope's request_id /
session_id body fields), and writes what could identify the replica that served each one:
the response headers, the router's log lines naming a worker, each replica's log lines naming
the request, and each replica's prompt-token counter. Everything is stopped at the end; the
script then lists any process still holding one of the ports (there must be none).

    PYTHONPATH=src .venv/bin/python bench/router_probe.py --router /path/to/vllm-router \
        --policy round_robin --out /tmp/router-probe
"""

import argparse
import json
import re
import time
import uuid
from pathlib import Path

import httpx
import psutil

from kvscope.config import DeploymentConfig, EngineConfig, RouterConfig
from kvscope.engines import deployment, kv_events
from kvscope.engines.process import port_free
from kvscope.engines.vllm import VllmEngine
from kvscope.finalize import replicas
from kvscope.finalize.provenance import build_ledger
from kvscope.finalize.routing_misses import routing_columns
from kvscope.records.run_dir import ENGINE_LOG, replica_dir


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url, timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith(("vllm:prompt_tokens_total", "vllm:request_success_total")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def snapshot(running: deployment.RunningDeployment) -> dict[str, dict[str, float]]:
    return {n: counters(h.endpoints.metrics_url or "") for n, h in running.replicas.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", required=True, help="the vllm-router program")
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("/tmp/router-probe"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    engine = EngineConfig(
        port=18400, kv_events_port=18450, kv_capacity_tokens=4096, context_length=2048,
        startup_timeout_s=400, extra_args=("--enable-log-requests",),
    )  # fmt: skip
    router = RouterConfig(
        policy=args.policy, port=18490, metrics_port=18491, executable=args.router
    )
    dep = DeploymentConfig(replicas=2, router=router)
    ports = [18400, 18410, 18450, 18451, 18460, 18461, 18490, 18491]
    report: dict = {"policy": args.policy, "requests": []}
    rows: list[dict] = []
    tokens: dict[str, list[int]] = {}
    t0 = time.monotonic()
    with deployment.running(dep, engine, args.out) as running:
        report["startup_s"] = time.monotonic() - t0
        report["launch_commands"] = running.launch_commands()
        handles = [h.process for h in running.replicas.values()]
        handles.append(running.router.process if running.router else None)
        pids = [pid for p in handles if p for pid in (p.pid, *p.descendants())]
        base = running.router.base_url if running.router else ""
        system = "You are a careful analyst. " * 40
        for i in range(args.requests):
            rid = str(uuid.uuid4())
            before = {
                n: counters(h.endpoints.metrics_url or "") for n, h in running.replicas.items()
            }
            body = {
                "model": "smollm2", "max_tokens": 4, "request_id": rid, "session_id": rid,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": f"Question {i % 2}: sum 2 and 3."}],
            }  # fmt: skip
            body |= VllmEngine(engine).prompt_ids_fields(body)
            start_ns = time.time_ns()
            reply = httpx.post(
                f"{base}/v1/chat/completions", headers={"x-request-id": rid}, json=body, timeout=300
            )
            after = {
                n: counters(h.endpoints.metrics_url or "") for n, h in running.replicas.items()
            }
            try:
                body = reply.json()
            except ValueError:
                body = {"text": reply.text[:300]}
            usage = body.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            tokens[rid] = VllmEngine.reply_prompt_ids(body) or []
            rows.append(
                {
                    "request_uuid": rid, "agent_id": ("planner", "executor")[i % 2],
                    "previous_agent_id": None, "workflow_run_id": "w", "status": "ok",
                    "start_ns": start_ns, "end_ns": time.time_ns(), "queue_ms": None,
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": details.get("cached_tokens"),
                }
            )  # fmt: skip
            report["requests"].append(
                {
                    "request_id": rid,
                    "status": reply.status_code,
                    "headers": dict(reply.headers),
                    "id": body.get("id"),
                    "usage": usage,
                    "counter_delta": {
                        n: {k: after[n][k] - before[n].get(k, 0.0) for k in after[n]} for n in after
                    },
                }
            )
        ledgers, stored_by = {}, {}
        for name, h in running.replicas.items():
            batches = kv_events.replay(h.endpoints.kv_events_replay or "", 0)
            pairs = [(b, e) for b in batches for e in b.events]
            ledgers[name] = build_ledger(pairs)
            stored_by[name] = sorted({e.session_id for _, e in pairs if e.session_id})
        report["kv_events_session_ids"] = stored_by
        ids = [r["request_uuid"] for r in rows]
        logs = {
            n: (replica_dir(args.out, n) / ENGINE_LOG).read_text(errors="replace") for n in ledgers
        }
        replica_of = replicas.from_logs(logs, ids)
        report["replica_from_logs"] = replica_of
        report["replica_from_kv_events"] = replicas.from_kv_events(stored_by, ids)
        for r in rows:
            r["replica"] = replica_of[r["request_uuid"]]
        router_log = re.sub(r"\x1b\[[0-9;]*m", "", (args.out / "router.log").read_text())
        report["router_log_lines"] = {
            r["request_uuid"]: [x for x in router_log.splitlines() if r["request_uuid"] in x][:5]
            for r in rows
        }
        report["router_log_tail"] = router_log.splitlines()[-15:]
        report["routing"] = [
            {k: r[k] for k in ("request_uuid", "agent_id", "replica", "prompt_tokens",
                               "cached_tokens", "routing_miss_tokens", "routing_miss_replica")}
            for r in routing_columns(rows, tokens, ledgers)
        ]  # fmt: skip
        if running.router:
            report["router_metrics"] = [
                line
                for line in httpx.get(running.router.metrics_url, timeout=10).text.splitlines()
                if not line.startswith("#") and ("worker" in line or "request" in line)
            ][:80]
    report["ports_still_held"] = [p for p in ports if not port_free("127.0.0.1", p)]
    report["processes"] = len(pids)
    report["processes_left"] = [p for p in pids if psutil.pid_exists(p)]
    report["total_s"] = time.monotonic() - t0
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "router_metrics"}, indent=1))


if __name__ == "__main__":
    main()
