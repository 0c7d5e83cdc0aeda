"""The MLflow run's params: what a run was configured and found to be, in MLflow's flat terms."""

from typing import Any

from kvscope.config import ExperimentConfig, config_hash
from kvscope.workload import prompts, supervisor_prompts


def mlflow_params(
    cfg: ExperimentConfig,
    model: str,
    version: str | None,
    facts: dict[str, Any],
    env: dict[str, Any],
) -> dict[str, object]:
    """The run's configuration as MLflow params (unset ones left out)."""
    w, e = cfg.workload, cfg.engine
    peer = w.workflow == "peer"
    dynamic = not peer or w.loop == "dynamic"
    params: dict[str, object] = {
        "model": model,
        "model_id": env.get("model", {}).get("model_id"),
        "model_revision": env.get("model", {}).get("revision"),
        "serving_engine": e.kind,
        "engine_version": version,
        "launch_command": env["engine"]["launch_command"],
        # dtype: what the engine ran with; why: the rule and the CPU flags (engines/cpu.py)
        "dtype": (env["engine"].get("dtype") or {}).get("dtype"),
        "dtype_reason": (env["engine"].get("dtype") or {}).get("reason"),
        "cpu_isa_flags": ",".join(env.get("cpu", {}).get("isa_flags") or []) or None,
        "prefix_cache": e.prefix_cache,
        "radix_eviction_policy": e.eviction_policy,
        "kv_capacity_tokens_config": e.kv_capacity_tokens,
        "kv_capacity_tokens": facts.get("capacity_tokens"),
        "context_length": e.context_length,
        "workflow": workflow_param(cfg),
        "workflow_kind": w.workflow,
        "loop_mode": w.loop if peer else None,
        "cycles": w.cycles if peer and w.loop == "fixed" else None,
        "max_cycles": w.max_cycles if peer and w.loop == "model" else None,
        "max_steps": w.max_steps if dynamic else None,
        "workers": w.workers if not peer else None,
        "workflows": w.workflows,
        "concurrency": w.concurrency,
        "prompt_mode": w.mode,
        "prompt_layout": w.layout,
        "prompt_sharing": w.sharing if w.mode == "tasks" else None,
        "cold_start": cfg.cold_start,
        "prompt_template_version": (
            prompts.TEMPLATE_VERSION if peer else supervisor_prompts.TEMPLATE_VERSION
        ),
        "max_tokens": w.max_tokens if w.mode == "tasks" else w.synthetic.output_tokens,
        "fixed_prompt_tokens": w.synthetic.fixed_tokens if w.mode == "synthetic" else None,
        "dynamic_prompt_tokens": w.synthetic.dynamic_tokens if w.mode == "synthetic" else None,
        "tool": w.tool,
        "random_seed": w.seed,
        "configuration_hash": config_hash(cfg),
    }
    if cfg.app is not None:  # the app is the workload: kvscope's workload settings do not apply
        workload_keys = set(_WORKLOAD_PARAMS)
        params = {k: v for k, v in params.items() if k not in workload_keys}
        params |= {
            "workflow_type": cfg.app.workflow_type,
            "app_command": " ".join(cfg.app.command) or None,
            "store_prompts": cfg.app.store_prompts,
        }
    return {k: v for k, v in params.items() if v is not None}


def workflow_param(cfg: ExperimentConfig) -> str:
    """The workflow's agents, dash-joined: PEER's four, or the supervisor and its workers."""
    w = cfg.workload
    if w.workflow == "supervisor":
        agents = (supervisor_prompts.SUPERVISOR, *supervisor_prompts.WORKERS[: w.workers])
        return "-".join(agents)
    return "-".join(prompts.AGENTS)


_WORKLOAD_PARAMS = (
    "workflow", "workflow_kind", "max_steps", "workers",
    "loop_mode", "cycles", "max_cycles", "workflows", "concurrency", "prompt_mode",
    "prompt_layout", "prompt_sharing", "prompt_template_version", "max_tokens",
    "fixed_prompt_tokens", "dynamic_prompt_tokens", "tool", "random_seed",
)  # fmt: skip
