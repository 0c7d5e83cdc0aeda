"""What `kvscope engine up` leaves behind, so that `status` and `down` find the engine again."""

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from kvscope import paths
from kvscope.engines.base import Endpoints


@dataclass(frozen=True)
class EngineState:
    kind: str
    pid: int | None  # None: attached, kvscope did not start it
    descendants: tuple[int, ...]
    endpoints: Endpoints
    launch_command: str | None
    log_path: str | None
    started_at: float = field(default_factory=time.time)
    startup_s: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, Any] | None = None
    dtype: dict[str, Any] | None = None  # DtypeChoice.as_dict(): what was launched and why

    def alive(self) -> bool:
        return self.pid is not None and psutil.pid_exists(self.pid)


def state_file() -> Path:
    return paths.state_dir() / "engine.json"


def environment_file() -> Path:
    return paths.state_dir() / "environment.json"


def log_file(kind: str) -> Path:
    return paths.state_dir() / "logs" / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.log"


def save(state: EngineState) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(state), indent=2))


def load() -> EngineState | None:
    try:
        data = json.loads(state_file().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    data["endpoints"] = Endpoints(**data["endpoints"])
    data["descendants"] = tuple(data.get("descendants", ()))
    return EngineState(**data)


def clear() -> None:
    state_file().unlink(missing_ok=True)
