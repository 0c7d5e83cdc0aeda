"""Typed configuration, loaded from YAML and validated before any engine starts."""

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvscope.config_deployment import DeploymentConfig, RouterConfig
from kvscope.errors import ConfigError
from kvscope.records.priorities import HintPolicy

__all__ = ["DeploymentConfig", "HintPolicy", "RouterConfig"]  # also part of the configuration

EngineKind = Literal["vllm", "sglang", "attach"]
EvictionPolicy = Literal["lru", "lfu", "slru", "priority", "tlru"]


class EngineConfig(BaseModel):
    """One inference engine, in kvscope's own terms; each engine file maps these to its flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EngineKind = "vllm"
    model: str | None = Field(
        None, description="Model path or id; None = the engine's embedded default model."
    )
    served_model_name: str | None = None
    url: str | None = Field(
        None, description="Attach to an engine already running at this base URL (no launch)."
    )
    metrics_url: str | None = Field(None, description="Override of <url>/metrics.")
    api_key_env: str | None = Field(
        None,
        description="The environment variable that holds the engine's API key (default: "
        "KVSCOPE_API_KEY, else OPENAI_API_KEY); only the name is kept, never the key.",
    )
    kv_events_endpoint: str | None = Field(
        None, description="ZMQ endpoint of a running engine's KV events (attach only)."
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    kv_events_port: int = Field(5557, ge=1, le=65535)
    context_length: int = Field(2048, ge=256)
    kv_capacity_tokens: int | None = Field(
        None, ge=1, description="KV cache size in tokens: the cache-pressure knob."
    )
    prefix_cache: bool = True
    eviction_policy: EvictionPolicy = "lru"
    eviction_policy_config: dict[str, int | float] | None = Field(
        None, description="Policy parameters, e.g. tlru: {threshold, next_prompt_estimate}."
    )
    page_size: int | None = Field(None, ge=1)
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Weights and compute dtype; auto: the engine's best choice for this machine "
        "(vLLM CPU: bfloat16 only where the CPU has native bf16, else float32).",
    )
    hierarchical_cache: bool = False
    kv_events: bool = True
    request_log_level: int = Field(0, ge=0, le=3)
    output_dir: Path | None = Field(
        None, description="Where engine-side files (exports, request logs) go; None = state dir."
    )
    python: str | None = Field(
        None, description="Interpreter that has the engine installed; None = kvscope's choice."
    )
    startup_timeout_s: float = Field(300.0, gt=0)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "EngineConfig":
        if self.kind == "vllm" and self.eviction_policy != "lru":
            raise ValueError("vLLM's prefix cache evicts by LRU only: eviction_policy must be lru")
        if self.kind == "vllm" and self.hierarchical_cache:
            raise ValueError("hierarchical_cache is an SGLang feature (HiCache)")
        if self.hierarchical_cache and not self.prefix_cache:
            raise ValueError("hierarchical_cache needs prefix_cache (SGLang refuses the pair)")
        if self.eviction_policy == "tlru":
            tlru = self.eviction_policy_config or {}
            if not tlru.get("threshold", 0) > tlru.get("next_prompt_estimate", 0):
                raise ValueError(
                    "eviction_policy tlru needs eviction_policy_config with threshold > "
                    "next_prompt_estimate (tokens): {threshold: 4096, next_prompt_estimate: 512}"
                )
        if self.kv_events_port == self.port:
            raise ValueError("kv_events_port must differ from port")
        return self


Layout = Literal["shared-first", "role-first"]
# RQ5: what the agents' prompts share, from nothing to a whole conversation branch
# (kvscope.workload.sharing says what each mode puts where).
Sharing = Literal["none", "system", "task", "documents", "branch"]


class SyntheticConfig(BaseModel):
    """KVFlow-style microbenchmark prompts: token lengths controlled exactly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fixed_tokens: int = Field(512, ge=16, description="Per-agent fixed prompt (role + examples).")
    dynamic_tokens: int = Field(32, ge=1, description="Per-call dynamic suffix.")
    output_tokens: int = Field(32, ge=1)


class WorkloadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workflow: Literal["peer", "supervisor"] = Field(
        "peer",
        description="peer: Planner/Executor/Expresser/Reviewer; supervisor: a supervisor routing "
        "among `workers` workers (kvscope.workload.supervisor).",
    )
    mode: Literal["tasks", "synthetic"] = "tasks"
    workflows: int = Field(4, ge=1, description="How many workflow runs (one thread each).")
    concurrency: int = Field(2, ge=1, description="Workflows in flight at once.")
    loop: Literal["fixed", "model", "dynamic"] = Field(
        "fixed",
        description="PEER's loop. fixed: `cycles` PEER cycles; model: the Reviewer's text verdict "
        "(DONE|REVISE) decides, <= max_cycles; dynamic: the Reviewer's structured choice "
        "(planner | executor | end) decides, <= max_steps calls.",
    )
    cycles: int = Field(2, ge=1)
    max_cycles: int = Field(3, ge=1, description="Bound of the model-decided loop (loop: model).")
    max_steps: int = Field(
        12,
        ge=4,
        description="Most model calls per workflow of a dynamic workflow (loop: dynamic, and the "
        "supervisor); a route that would pass it ends the workflow instead.",
    )
    workers: int = Field(4, ge=3, le=6, description="Supervisor workers (workflow: supervisor).")
    layout: Layout = "shared-first"
    sharing: Sharing = Field(
        "documents", description="RQ5: what the agents' prompts share (tasks mode)."
    )
    max_tokens: int = Field(32, ge=1, description="Output tokens per agent call (tasks mode).")
    tool: bool = Field(True, description="The Executor calls a local tool.")
    seed: int = 0
    synthetic: SyntheticConfig = SyntheticConfig()
    request_timeout_s: float = Field(120.0, gt=0)
    store_prompts: bool = Field(
        False, description="Keep each call's raw messages and serialized prompt text (opt-in)."
    )

    @model_validator(mode="after")
    def _check_sharing(self) -> "WorkloadConfig":
        if self.workflow == "supervisor" and self.mode != "tasks":
            raise ValueError("workflow supervisor runs on the task set: mode must be tasks")
        if self.workflow == "supervisor" and (self.sharing, self.layout) != (
            "documents",
            "shared-first",
        ):
            raise ValueError("workflow supervisor has one prompt layout: leave sharing and layout")
        if self.mode == "synthetic" and self.sharing != "documents":
            raise ValueError("sharing is a tasks-mode setting (synthetic prompts share no context)")
        if self.layout == "role-first" and self.sharing in _NOT_ROLE_FIRST:
            raise ValueError(
                f"layout role-first does not combine with sharing {self.sharing}: "
                f"{_NOT_ROLE_FIRST[self.sharing]}"
            )
        return self


# Sharing modes where the layout switch is meaningless (see kvscope.workload.sharing).
_NOT_ROLE_FIRST = {
    "none": "none already starts every prompt with the agent's role",
    "branch": "a branch's system message is the same for every agent (turns name their agent)",
}


class AppConfig(BaseModel):
    """A program of the user's own, profiled as it runs (`kvscope profile`, `kvscope.profile()`):
    its model calls are the workload, so the `workload` section does not apply."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: tuple[str, ...] = Field((), description="The program's argv; () = this process.")
    workflow_type: str = Field("app", description="The rows' workflow_type.")
    store_prompts: bool = Field(
        False, description="Keep each call's raw messages and serialized prompt text (opt-in)."
    )


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; None = a local SQLite store under runs_dir."
    )
    experiment: str = "agent-specific-kv-cache-profiling"
    traces: bool = True


class ExperimentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "demo"
    engine: EngineConfig = EngineConfig()
    workload: WorkloadConfig = WorkloadConfig()
    tracking: TrackingConfig = TrackingConfig()
    app: AppConfig | None = Field(None, description="Set: profile this program, not `workload`.")
    runs_dir: Path = Path("runs")
    # The design note suggests 250 ms; a busy 2-core machine stalls the engine's /metrics for
    # half a second at times, so runs sample at 200 ms to keep >= 4 real samples per second.
    metrics_interval_s: float = Field(0.2, gt=0, description="/metrics sampling interval.")
    cold_start: bool = Field(
        True, description="Empty the engine's prefix cache before the workload (reused engines)."
    )
    deployment: DeploymentConfig | None = Field(
        None, description="Set: `deployment.replicas` copies of `engine` behind a router."
    )
    eviction_hints: HintPolicy | None = Field(
        None,
        description="Each call's engine priority from the workflow (SGLang; probe/hints.py): "
        "steps-to-execution or predicted-next; none (or unset): no priority is sent.",
    )

    @model_validator(mode="after")
    def _check_deployment(self) -> "ExperimentConfig":
        if self.eviction_hints not in (None, "none") and self.engine.kind == "vllm":
            raise ValueError(
                "eviction_hints set SGLang's per-request priority; vLLM's prefix cache is LRU "
                "only and has no such lever (use engine.kind: sglang, or attach)"
            )
        if self.deployment is not None:
            self.deployment.check_with(self.engine)
        else:
            check_attach_url(self.engine)
        return self


def check_attach_url(engine: EngineConfig) -> None:
    """One attached engine needs its URL (a deployment's attached replicas have theirs in
    deployment.replica_urls instead)."""
    if engine.kind == "attach" and not engine.url:
        raise ValueError("engine kind 'attach' needs `url` (the running server's base URL)")


def parse_experiment(data: dict[str, Any], source: str = "config") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {one_line(err)}") from None


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def parse_engine(data: dict[str, Any], source: str = "config") -> EngineConfig:
    """One engine on its own (never a deployment's replicas)."""
    try:
        engine = EngineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {one_line(err)}") from None
    try:
        check_attach_url(engine)
    except ValueError as err:
        raise ConfigError(f"{source}: engine: {err}") from None
    return engine


def one_line(err: ValidationError, whole: str = "engine") -> str:
    """A pydantic error as one line: `path.to.field: message; ...` (`whole`: the model itself)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}" for e in err.errors()
    )


def check_experiment(cfg: ExperimentConfig) -> None:
    """What no single section can check: prompt lengths against the context, tokenizer access."""
    w, e = cfg.workload, cfg.engine
    if w.mode == "synthetic":
        s = w.synthetic
        # one call = chat template (14 tokens for SmolLM2; 32 leaves room) + fixed + dynamic
        need = 32 + s.fixed_tokens + s.dynamic_tokens + s.output_tokens
        if need > e.context_length:
            raise ConfigError(
                f"synthetic prompts need up to {need} tokens but engine.context_length is "
                f"{e.context_length}; shorten the prompt lengths or raise context_length"
            )
    if e.kind == "attach" and w.mode == "synthetic":
        raise ConfigError("synthetic mode needs the model's tokenizer: not available on attach")


# Sections added after runs were recorded: left out while unset, so a configuration without
# them keeps the hash and the recorded form (config.yaml, run.json) it always had.
_OMIT_UNSET = ("deployment", "eviction_hints")


def as_dict(model: BaseModel) -> dict[str, Any]:
    """The configuration as JSON-able data, the way runs record it (unset new sections left out)."""
    data = model.model_dump(mode="json")
    for name in _OMIT_UNSET:
        if name in data and data[name] is None:
            del data[name]
    return data


def config_hash(model: BaseModel) -> str:
    """Stable short hash of a configuration (field order independent)."""
    text = json.dumps(as_dict(model), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
