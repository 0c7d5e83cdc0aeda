"""A run directory: `runs/<benchmark_run_id>/`, the id's format, and the names of its files.

Each stream's file name is defined with its record (requests, tokens, metrics, kv_events,
blocks); the files here are the run's description and what finalize, analysis and the report
write from the streams.
"""

import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

from kvscope.records.blocks import BLOCKS_PARQUET
from kvscope.records.kv_events import KV_EVENTS_PARQUET, KV_SUMMARY
from kvscope.records.metrics import METRICS_GAPS, METRICS_PARQUET
from kvscope.records.requests import REQUESTS_PARQUET

CONFIG_YAML = "config.yaml"  # the resolved configuration
RUN_JSON = "run.json"  # id, configuration hash, config, launch command, cache reset, environment
ENVIRONMENT_JSON = "environment.json"
LAUNCH_COMMAND = "launch_command.txt"
ENGINE_LOG = "engine.log"
FINALIZE_JSON = "finalize.json"  # what finalize read and matched (torn lines, KV event counts)
SUMMARY_JSON = "summary.json"  # the run's analysis, as printed
TIMELINE_PNG = "timeline.png"
EVICTIONS_PNG = "evictions.png"
REPORT_HTML = "report.html"
REPORT_ERROR = "report.error.txt"  # why report.html could not be written
REPLAY_JSON = "replay.json"  # `kvscope replay RUN`: each policy x capacity, and fidelity
REPLAY_PNG = "replay.png"  # its hit ratio vs capacity per policy and agent
# A deployment (replicas behind a router): each replica's own streams, under the same names as
# one engine's, in replicas/<name>/ (its engine.log, metrics, KV events); the router's beside.
REPLICAS_DIR = "replicas"
ROUTER_LOG = "router.log"
# An SGLang replica's own files: its output_dir is replicas/<name>/ (engines.deployment), where
# SglangEngine.launch puts its JSON request log (a file per host, rotated hourly) and its
# request-metrics export (a file per hour); finalize places calls and takes timings from them.
SGLANG_REQUEST_LOGS = "request_logs"
SGLANG_REQUEST_METRICS = "request_metrics"
ROUTER_METRICS = "router_metrics.json"  # the router's /metrics at the start and the end

# What the MLflow run keeps (the JSONL streams are folded into their tables).
ARTIFACTS = (
    REQUESTS_PARQUET,
    CONFIG_YAML,
    LAUNCH_COMMAND,
    ENVIRONMENT_JSON,
    RUN_JSON,
    SUMMARY_JSON,
    ENGINE_LOG,
    METRICS_PARQUET,
    METRICS_GAPS,
    TIMELINE_PNG,
    KV_EVENTS_PARQUET,
    BLOCKS_PARQUET,
    KV_SUMMARY,
    EVICTIONS_PNG,
    REPORT_HTML,
    REPLAY_JSON,
    REPLAY_PNG,
    ROUTER_LOG,
    ROUTER_METRICS,
)
# What the MLflow run keeps of each replica, under replicas/<name>/.
REPLICA_ARTIFACTS = (ENGINE_LOG, METRICS_PARQUET, METRICS_GAPS, KV_SUMMARY, TIMELINE_PNG)

_STAMP = re.compile(r"-\d{8}-\d{6}-[0-9a-f]{6}$")  # new_run's time and random suffix


def new_run(runs_dir: Path, name: str) -> tuple[str, Path]:
    """A fresh benchmark_run_id (`<name>-<YYYYmmdd-HHMMSS>-<6 hex>`) and its directory."""
    run_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    path = runs_dir / run_id
    path.mkdir(parents=True, exist_ok=False)
    return run_id, path


def run_name(run_id: str) -> str:
    """The name a run was started under: its id without the time stamp and random suffix."""
    return _STAMP.sub("", run_id)


def read_run_json(run_dir: Path) -> dict[str, Any]:
    """run.json, or {} for a run directory without one."""
    path = run_dir / RUN_JSON
    return json.loads(path.read_text()) if path.exists() else {}


def replica_dir(run_dir: Path, name: str) -> Path:
    """Where a deployment's replica `name` keeps its streams (created by the capture)."""
    return run_dir / REPLICAS_DIR / name


def replica_dirs(run_dir: Path) -> dict[str, Path]:
    """A deployment run's replicas by name (r0, r1, ...); {} for a run of one engine."""
    root = run_dir / REPLICAS_DIR
    if not root.is_dir():
        return {}
    found = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: (len(p.name), p.name))
    return {p.name: p for p in found}  # r2 before r10
