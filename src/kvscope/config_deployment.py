"""The `deployment` section of an experiment: several replicas of its engine behind a router.

Kept apart from kvscope.config (which holds it as ExperimentConfig.deployment and re-exports
these names); what depends on the engine section is checked by `check_with`, given the engine.
"""

from typing import Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineFields(Protocol):
    """What the checks read of config.EngineConfig."""

    @property
    def kind(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def kv_events_port(self) -> int: ...
    @property
    def kv_events(self) -> bool: ...
    @property
    def url(self) -> str | None: ...


RouterKind = Literal["vllm-router", "sglang-router"]
RouterPolicy = Literal[
    "random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
    "sticky_least_loaded", "manual",
]  # fmt: skip
# The policies each router's CLI takes: `vllm-router --help` (0.1.17) and
# `sglang-router launch --help` (0.3.2; its `bucket` is a PD-mode --prefill-policy only).
ROUTER_POLICIES: dict[str, frozenset[str]] = {
    "vllm-router": frozenset(get_args(RouterPolicy)) - {"manual"},
    "sglang-router": frozenset({"random", "round_robin", "cache_aware", "power_of_two", "manual"}),
}


class RouterConfig(BaseModel):
    """The router in front of the replicas: launched by kvscope, or attached to (`url`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: RouterKind = "vllm-router"
    policy: RouterPolicy = Field(
        "cache_aware", description="The router's --policy (cache_aware is vllm-router's default)."
    )
    url: str | None = Field(None, description="Attach to a router already running at this URL.")
    metrics_url: str | None = Field(
        None, description="The router's Prometheus endpoint; None = http://host:metrics_port."
    )
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1, le=65535)
    metrics_port: int = Field(29000, ge=1, le=65535)
    executable: str | None = Field(
        None, description="The router's program; None = the one next to kvscope's Python, or PATH."
    )
    # cache_aware's knobs (both routers' flags of the same names); None: the router's default.
    # Passed only with policy cache_aware: a sweep may cross them with the other policies.
    cache_threshold: float | None = Field(
        None, ge=0, le=1, description="cache_aware: the prefix match ratio that picks a worker"
    )
    balance_abs_threshold: int | None = Field(
        None, ge=0, description="cache_aware: balance by load when max - min load exceeds this"
    )
    balance_rel_threshold: float | None = Field(
        None, ge=1, description="cache_aware: ... and max load exceeds min load times this"
    )
    eviction_interval_secs: int | None = Field(
        None, ge=1, description="cache_aware: seconds between its prefix tree's evictions"
    )
    max_tree_size: int | None = Field(
        None, ge=1, description="cache_aware: per-worker character budget of its prefix tree"
    )
    startup_timeout_s: float = Field(60.0, gt=0)
    extra_args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> "RouterConfig":
        if self.policy not in ROUTER_POLICIES[self.kind]:
            known = ", ".join(sorted(ROUTER_POLICIES[self.kind]))
            raise ValueError(f"{self.kind} has no policy {self.policy!r} (it has: {known})")
        if self.port == self.metrics_port:
            raise ValueError("router metrics_port must differ from port")
        return self


CACHE_AWARE_KNOBS = (
    "cache_threshold", "balance_abs_threshold", "balance_rel_threshold",
    "eviction_interval_secs", "max_tree_size",
)  # fmt: skip


class DeploymentConfig(BaseModel):
    """Several replicas of `engine` behind a router (issue 17). Launched replicas get their own
    ports: replica i serves on engine.port + i * port_stride and publishes KV events on
    engine.kv_events_port + i * port_stride (vLLM's replay socket: one above). Attached ones
    (engine.kind attach) are named by their URLs and, optionally, KV event endpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(2, ge=1, le=16)
    router: RouterConfig = RouterConfig()
    port_stride: int = Field(10, ge=2, le=1000)
    replica_urls: tuple[str, ...] = Field((), description="Attach: the replicas' base URLs.")
    kv_events_endpoints: tuple[str, ...] = Field(
        (), description="Attach: each replica's ZMQ KV event endpoint, in replica_urls' order."
    )

    def replica_names(self) -> list[str]:
        """The names rows and samples carry in their `replica` column: r0, r1, ..."""
        return [f"r{i}" for i in range(self.replicas)]

    def check_with(self, engine: "EngineFields") -> None:
        """What depends on the engine section; ValueError names the field."""
        r = self.router
        if engine.kind == "attach":
            if engine.url:
                raise ValueError(
                    "engine.url: a deployment's attached replicas are deployment.replica_urls "
                    "and its router deployment.router.url"
                )
            if len(self.replica_urls) != self.replicas:
                raise ValueError(
                    f"engine kind attach: deployment.replica_urls needs one URL per replica "
                    f"({self.replicas}), got {len(self.replica_urls)}"
                )
            if self.kv_events_endpoints and len(self.kv_events_endpoints) != self.replicas:
                raise ValueError("deployment.kv_events_endpoints: one per replica, or none")
        else:
            if self.replica_urls or self.kv_events_endpoints:
                raise ValueError(
                    "deployment.replica_urls / kv_events_endpoints are for attached replicas "
                    "(engine.kind attach); launched ones get ports from engine.port"
                )
            if r.url:
                raise ValueError(
                    "deployment.router.url attaches to a running router: attach to its "
                    "replicas too (engine.kind attach with deployment.replica_urls)"
                )
            last = (self.replicas - 1) * self.port_stride
            if max(engine.port, engine.kv_events_port + 1) + last > 65535:
                raise ValueError("deployment: the last replica's ports pass 65535")
            used = {
                p + i * self.port_stride
                for i in range(self.replicas)
                for p in (engine.port, engine.kv_events_port, engine.kv_events_port + 1)
            }
            if len(used) != 3 * self.replicas:
                raise ValueError(
                    "deployment.port_stride: replicas' HTTP and KV event ports overlap; "
                    "raise port_stride or move engine.kv_events_port away from engine.port"
                )
            if not r.url and used & {r.port, r.metrics_port}:
                raise ValueError("deployment.router: its port or metrics_port is a replica's")
        if r.policy == "kv_aware" and not engine.kv_events:
            raise ValueError(
                "router policy kv_aware reads the replicas' KV events: engine.kv_events"
            )
        if r.policy == "kv_aware" and engine.kind == "attach" and not self.kv_events_endpoints:
            raise ValueError("router policy kv_aware on attached replicas: kv_events_endpoints")
