"""The engine's API key: where it comes from, where it goes, and that it is written nowhere.

    key = api_key(cfg.api_key_env)      # None: the engine takes requests without one
    headers(cfg.api_key_env)            # {"Authorization": "Bearer <key>"} or {}

Where it comes from: the environment variable `engine.api_key_env` names (an error if that is
not set), else KVSCOPE_API_KEY, else OPENAI_API_KEY. Where it goes: every request kvscope makes to
the engine (or the router in front of it): health and model probes, /metrics, the workload's
calls, a profiled program's OPENAI_API_KEY, and an engine kvscope launches (vLLM: VLLM_API_KEY,
in its environment, not on its command line). Where it never goes: a row, a span, a parameter,
an artifact, a log, the launch command (redacted: engines/base.Launch.shell). Only the variable's
name is kept in the config.
"""

import os
from collections.abc import Mapping

from kvscope.errors import ConfigError

DEFAULT_ENVS = ("KVSCOPE_API_KEY", "OPENAI_API_KEY")


def api_key(env_name: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    if env_name:
        value = env.get(env_name)
        if not value:
            raise ConfigError(f"engine.api_key_env names {env_name}, which is not set")
        return value
    return next((env[name] for name in DEFAULT_ENVS if env.get(name)), None)


def headers(env_name: str | None = None) -> dict[str, str]:
    key = api_key(env_name)
    return {"Authorization": f"Bearer {key}"} if key else {}
