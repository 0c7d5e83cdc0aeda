"""A run directory: `runs/<benchmark_run_id>/`, the id's format, the names of its files, and
`RunDir`, the directory opened once for everything that reads it.

Each stream's file name is defined with its record (requests, tokens, metrics, kv_events,
blocks); the files here are the run's description and what finalize, analysis and the report
write from the streams.

    run = RunDir.open(path)        # KvscopeError: not a directory
    run.info                        # run.json ({} without one)
    run.requests                    # the request table (finalized, else read from the stream)
    run.tokens                      # request_uuid -> prompt token ids (records.tokens)

Each file is read on first use and kept, so the steps of one command (a replay's source, its
calls, its engine) read it once. A RunDir does not notice files written after a read: open a new
one after finalize (which writes the tables).
"""

import json
import re
import secrets
import time
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kvscope.errors import KvscopeError
from kvscope.records import blocks, metrics, requests, tokens
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


class RunDir:
    """A run directory opened once (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def open(cls, path: "Path | RunDir") -> "RunDir":
        """`path` opened (a RunDir is returned as it is); KvscopeError when it is no directory."""
        if isinstance(path, RunDir):
            return path
        if not Path(path).is_dir():
            raise KvscopeError(f"{path} is not a run directory")
        return cls(Path(path))

    @property
    def name(self) -> str:
        return self.path.name

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @cached_property
    def info(self) -> dict[str, Any]:
        """run.json, or {} for a run directory without one."""
        return read_run_json(self.path)

    @property
    def has_requests(self) -> bool:
        return requests.exists(self.path)

    @cached_property
    def requests(self) -> pa.Table:
        """The request table; KvscopeError when the directory has none."""
        if not self.has_requests:
            raise KvscopeError(f"{self.path} has no request table: not a kvscope run directory")
        return requests.load_table(self.path)

    @property
    def has_tokens(self) -> bool:
        return tokens.has_tokens(self.path)

    @cached_property
    def tokens(self) -> dict[str, np.ndarray]:
        """request_uuid -> its prompt token ids, as records.tokens.load_tokens states."""
        return tokens.load_tokens(self.path)

    @cached_property
    def metrics(self) -> pa.Table | None:
        """metrics.parquet (the /metrics samples), None without it."""
        return metrics.load_table(self.path)

    @cached_property
    def blocks(self) -> pa.Table | None:
        """blocks.parquet (one row per block life), None without it."""
        return blocks.load_table(self.path)

    @cached_property
    def replicas(self) -> dict[str, Path]:
        """A deployment run's replica folders by name; {} for a run of one engine."""
        return replica_dirs(self.path)
