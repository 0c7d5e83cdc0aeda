"""Shared test helpers (tests/ is on sys.path via pytest's `pythonpath`)."""

import base64
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from kvscope.engines.process import free_port_range

ROOT = Path(__file__).resolve().parent.parent
VLLM_FIXTURES = ROOT / "tests" / "fixtures" / "vllm-0.32.0"
# Recorded outputs of SGLang 0.5.23's own code (their README says how they were produced).
SGLANG_FIXTURES = ROOT / "tests" / "fixtures" / "sglang-0.5.23"


def free_port(span: int = 1) -> int:
    """A port p such that p .. p+span-1 are free on loopback right now, below the ephemeral
    range, where an engine's own bind(0) cannot take it meanwhile (engines.process)."""
    return free_port_range(span)


# --- the integration session's engine (tests/integration/conftest.py) ---
KVSCOPE = [sys.executable, "-m", "kvscope.cli"]
CAPACITY = 8192


@dataclass
class Up:
    env: dict[str, str]
    state: dict[str, Any]
    state_dir: Path

    @property
    def engine_config(self) -> dict[str, Any]:
        """The running engine's config: an experiment with this engine section reuses it."""
        return dict(self.state["config"])

    @property
    def base(self) -> str:
        return self.state["endpoints"]["base_url"]

    def engine_file(self, folder: Path) -> Path:
        """The engine's config as a file in `folder` (a profile or run given it reuses it)."""
        path = folder / "engine.yaml"
        path.write_text(json.dumps(self.engine_config))  # JSON is YAML
        return path

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*KVSCOPE, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )


def recorded_frames() -> list[list[bytes]]:
    frames = []
    for line in (VLLM_FIXTURES / "kv_events.frames.jsonl").read_text().splitlines():
        d = json.loads(line)
        frames.append([
            bytes.fromhex(d["topic_hex"]), d["seq"].to_bytes(8, "big"),
            base64.b64decode(d["payload_b64"]),
        ])  # fmt: skip
    return frames


def restamped(frame: list[bytes]) -> list[bytes]:
    """The same batch with a current timestamp (as if published now)."""
    batch = msgpack.unpackb(frame[2])
    batch[0] = time.time()
    return [frame[0], frame[1], msgpack.packb(batch)]
