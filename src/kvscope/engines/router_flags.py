"""The flags both routers take under the same names (sglang-router's CLI and vllm-router's, its
fork), written once; engines/vllm_router.py and engines/sglang_router.py add their own."""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvscope.config import RouterConfig
from kvscope.config_deployment import CACHE_AWARE_KNOBS
from kvscope.engines.base import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from kvscope.engines.router import Replica


def shared(config: RouterConfig, replicas: "Sequence[Replica]") -> list[str]:
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
