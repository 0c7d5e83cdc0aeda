"""The engine interface: what kvscope needs from any inference engine, in its own terms."""

import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prometheus_client.metrics_core import Metric

from kvscope.config import EngineConfig

# Flag or variable names whose values are secrets: --api-key, --hf-token, HF_TOKEN, *_SECRET...
_SECRET_FLAG = re.compile(r"(api[-_]?key|secret|password|(^|[-_])token$)", re.IGNORECASE)
REDACTED = "***"


@dataclass(frozen=True)
class Endpoints:
    base_url: str
    metrics_url: str | None
    kv_events: str | None  # ZMQ endpoint of the KV event stream
    kv_events_subscriber_binds: bool = False  # True: the engine connects, the subscriber binds
    kv_events_replay: str | None = None  # ROUTER endpoint that replays missed batches


@dataclass(frozen=True)
class Launch:
    """The exact command that starts an engine, and the environment it adds."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def redacted_argv(self) -> list[str]:
        out: list[str] = []
        hide_next = False
        for arg in self.argv:
            if hide_next:
                out.append(REDACTED)
                hide_next = False
            elif arg.startswith("--") and _SECRET_FLAG.search(arg.split("=", 1)[0]):
                if "=" in arg:
                    out.append(arg.split("=", 1)[0] + "=" + REDACTED)
                else:
                    out.append(arg)
                    hide_next = True
            else:
                out.append(arg)
        return out

    def redacted_env(self) -> dict[str, str]:
        return {k: REDACTED if _SECRET_FLAG.search(k) else v for k, v in self.env}

    def shell(self) -> str:
        """One copy-pasteable line, secrets redacted."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.redacted_env().items())
        cmd = shlex.join(self.redacted_argv())
        return f"{env} {cmd}" if env else cmd


@dataclass(frozen=True)
class Capabilities:
    """What a running engine was seen to report; None = not checked or not checkable."""

    family: str | None  # "vllm" | "sglang" | None, from the /metrics names
    models: tuple[str, ...]
    cached_tokens: bool | None  # usage.prompt_tokens_details.cached_tokens present
    metrics: bool | None  # /metrics answers with engine counters
    kv_events: bool | None  # KV cache events arrived on the endpoint
    capacity_tokens: int | None
    notes: tuple[str, ...] = field(default=())


class Engine(ABC):
    """One engine kind; everything engine-specific (flags, metric names, quirks) is in its file."""

    name: ClassVar[str]
    health_path: ClassVar[str] = "/health"
    metric_prefix: ClassVar[str] = ""
    # kvscope counter name -> this engine's Prometheus sample name
    counter_samples: ClassVar[dict[str, str]] = {}

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @property
    def base_url(self) -> str:
        if self.config.url:
            return self.config.url.rstrip("/")
        return f"http://{self.config.host}:{self.config.port}"

    @abstractmethod
    def endpoints(self) -> Endpoints: ...

    @abstractmethod
    def launch(self) -> Launch | None:
        """The command to start the engine, or None when kvscope attaches to a running one."""

    def request_tags(
        self, request_uuid: str, agent_id: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """(extra body fields, extra headers) that carry kvscope's ids into the engine."""
        return {}, {}

    def preflight(self) -> None:
        """Raise one clear error for anything that would make the launch fail (before it)."""

    def version(self) -> str | None:
        return None

    def model_facts(self) -> dict[str, Any]:
        """Model id, revision, tokenizer, chat template, dtype... as far as this engine knows."""
        return {}

    @classmethod
    def runtime_facts(cls, families: Iterable[Metric]) -> dict[str, Any]:
        """KV cache facts read from the engine's own /metrics: capacity_tokens, block_size,
        kv_cache_dtype (None where this engine does not say)."""
        return {}

    @classmethod
    def capacity_tokens(cls, families: Iterable[Metric]) -> int | None:
        return cls.runtime_facts(families).get("capacity_tokens")

    @classmethod
    def counters(cls, families: Iterable[Metric]) -> dict[str, float | None]:
        """Engine counters in kvscope's names, summed over label sets; None = not exposed."""
        totals: dict[str, float | None] = dict.fromkeys(cls.counter_samples)
        wanted = {sample: name for name, sample in cls.counter_samples.items()}
        for family in families:
            for sample in family.samples:
                name = wanted.get(sample.name)
                if name is not None:
                    totals[name] = (totals[name] or 0.0) + sample.value
        return totals

    @classmethod
    def owns_metrics(cls, families: Iterable[Metric]) -> bool:
        return bool(cls.metric_prefix) and any(
            f.name.startswith(cls.metric_prefix) for f in families
        )
