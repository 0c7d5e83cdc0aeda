"""What both routers share: a replica as they see it, and the flags they take under the same
names (sglang-router's CLI and vllm-router's, its fork), written once; engines/vllm_router.py
and engines/sglang_router.py add their own, engines/router.py launches them."""

from collections.abc import Sequence
from dataclasses import dataclass

from kvscope.config import RouterConfig
from kvscope.config_deployment import CACHE_AWARE_KNOBS
from kvscope.engines.base import REQUEST_ID_HEADER


@dataclass(frozen=True)
class Replica:
    """One replica as the router and kvscope see it."""

    name: str  # r0, r1, ... (the `replica` column)
    base_url: str
    kv_events: str | None = None  # ZMQ endpoint a subscriber connects to
    kv_events_replay: str | None = None


def shared(config: RouterConfig, replicas: Sequence[Replica]) -> list[str]:
    """Where it listens (its /metrics too), its policy and workers, the header that names a
    call across the hop, and how long it waits for the workers."""
    return [
        "--host", config.host,
        "--port", str(config.port),
        "--policy", config.policy,
        "--worker-urls", *(r.base_url for r in replicas),
        "--prometheus-host", config.host,
        "--prometheus-port", str(config.metrics_port),
        "--request-id-headers", REQUEST_ID_HEADER,
        "--worker-startup-check-interval", "1",
        "--worker-startup-timeout-secs", str(max(1, round(config.startup_timeout_s))),
    ]  # fmt: skip


def cache_aware(config: RouterConfig) -> list[str]:
    """The knobs set in `config` as flags (`--cache-threshold 0.5` ...), for the cache_aware
    policy only (the other policies have no prefix tree to tune)."""
    if config.policy != "cache_aware":
        return []
    out: list[str] = []
    for knob in CACHE_AWARE_KNOBS:
        value = getattr(config, knob)
        if value is not None:
            out += ["--" + knob.replace("_", "-"), str(value)]
    return out
