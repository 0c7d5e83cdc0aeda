"""The reproducible environment of a measurement (the design note's Phase 0)."""

import importlib.metadata
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict
from typing import Any

import psutil

from kvscope.engines.base import Capabilities, Engine, Launch
from kvscope.engines.cpu import read_cpu

# kvscope's own stack, as far as installed; absent packages are recorded as None.
STACK = (
    "kvscope", "typer", "pydantic", "httpx", "pyzmq", "msgpack", "prometheus-client",
    "openai", "langgraph", "langchain-core", "mlflow", "mlflow-skinny", "pyarrow", "duckdb",
)  # fmt: skip


def package_versions(names: tuple[str, ...] = STACK) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpus() -> list[dict[str, str]]:
    """One entry per NVIDIA GPU (name, memory, driver); empty when there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=name,memory.total,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [line.split(", ") for line in out.stdout.strip().splitlines() if line.strip()]
    return [{"name": r[0], "memory": r[1], "driver": r[2]} for r in rows if len(r) == 3]


def collect(
    engine: Engine,
    *,
    launch: Launch | None,
    capabilities: Capabilities | None = None,
    runtime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    stack_versions = getattr(engine, "stack_versions", None)
    return {
        "os": platform.platform(),
        "python": sys.version.split()[0],
        # The ISA flags and caps decide the engine's dtype on a CPU (engines/cpu.py).
        "cpu": read_cpu(engine_env=engine.config.env).as_dict(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpus(),
        "packages": package_versions(),
        "engine": {
            "kind": engine.name,
            "version": engine.version(),
            "dtype": engine.dtype_choice().as_dict(),
            "packages": stack_versions() if callable(stack_versions) else None,
            "launch_command": launch.shell() if launch else None,
            "argv": launch.redacted_argv() if launch else None,
            "env": launch.redacted_env() if launch else None,
        },
        "model": {**engine.model_facts(), **(runtime or {})},
        "capabilities": asdict(capabilities) if capabilities else None,
    }
