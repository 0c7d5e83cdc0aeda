"""SGLang, the first-class target: launch with full telemetry (on a CUDA GPU, or on the CPU), or
attach by URL.

Every SGLang-specific name lives here (flags, metric names, the custom-label header). Flags are
checked against SGLang 0.5.23's own argument parser (tests/sglang_conformance) and a live server
(tests/integration/sglang); re-check on upgrade. Without a CUDA GPU, kvscope launches SGLang's
CPU engine (shared/notes/sglang-cpu-live.md) from its own venv (engines/sglang_install.py).
"""

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import httpx
from prometheus_client.metrics_core import Metric

from kvscope import paths
from kvscope.engines import model, sglang_ids, sglang_install
from kvscope.engines.base import REQUEST_ID_HEADER, Endpoints, Engine, LatencyHistogram, Launch
from kvscope.engines.cpu import DtypeChoice, choose_dtype, read_cpu
from kvscope.engines.install import Report, venv_python
from kvscope.engines.process import require_free_port
from kvscope.errors import ConfigError, EngineNotInstalled

TESTED_VERSION = "0.5.23"
AGENT_LABEL = "agent"
LABEL_HEADER = "x-custom-labels"  # SGLang's default --tokenizer-metrics-custom-labels-header
# Without --max-total-tokens SGLang's CPU engine sizes its KV pool from free host memory (GBs):
# kvscope's default on the CPU is a pool of this many tokens (as vLLM CPU's 1 GiB).
CPU_DEFAULT_CAPACITY = 32768
SMALL_MACHINE_CORES = 2  # where OMP_NUM_THREADS=1 was measured (cpu_threads)


def cpu_threads(cores: int | None) -> dict[str, str]:
    """OpenMP threads for SGLang's CPU engine on a machine of SMALL_MACHINE_CORES or fewer.

    Measured on a 2-core AVX-512 EPYC (shared/notes/sglang-cpu-live.md): with the default (one
    thread per core) the model's threads compete with the tokenizer, detokenizer and HTTP
    processes and with kvscope itself, and requests under load were 3-6x slower than with one
    thread. Larger machines keep SGLang's own choice.
    """
    if cores is None or cores > SMALL_MACHINE_CORES:
        return {}
    return {"OMP_NUM_THREADS": "1"}


@functools.cache
def gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def importable(python: str, module: str) -> bool:
    code = f"import importlib.util,sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", code], timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class SglangEngine(Engine):
    name: ClassVar[str] = "sglang"
    prompt_ids_module: ClassVar[str | None] = "kvscope.engines.sglang_ids"
    metric_prefix: ClassVar[str] = "sglang:"
    cache_reset_path: ClassVar[str | None] = "/flush_cache"
    # Tokenizer counters carry the `agent` label (and cached_tokens_total `cache_source`:
    # device / host / storage); kvscope_values sums them. kv_used_tokens excludes the evictable
    # radix-cached slots (sglang:kv_evictable_tokens), as vLLM's usage does.
    metric_samples: ClassVar[dict[str, str]] = {
        "kv_used_tokens": "sglang:kv_used_tokens",
        "kv_evictable_tokens": "sglang:kv_evictable_tokens",  # the radix tree's unlocked tokens
        "kv_capacity_tokens": "sglang:max_total_num_tokens",
        "kv_usage": "sglang:token_usage",
        "cache_hit_rate": "sglang:cache_hit_rate",  # of the LAST prefill batch only
        "running_requests": "sglang:num_running_reqs",
        "queued_requests": "sglang:num_queue_reqs",
        "gen_throughput": "sglang:gen_throughput",
        "prompt_tokens_total": "sglang:prompt_tokens_total",
        "cached_tokens_total": "sglang:cached_tokens_total",
        "generation_tokens_total": "sglang:generation_tokens_total",
        "evicted_tokens_total": "sglang:evicted_tokens_total",
    }
    # No decode histogram: SGLang 0.5.23 does not observe its decode_forward stage in metrics.
    latency_histograms: ClassVar[dict[str, LatencyHistogram]] = {
        "ttft_seconds": LatencyHistogram("sglang:time_to_first_token_seconds"),
        "e2e_seconds": LatencyHistogram("sglang:e2e_request_latency_seconds"),
        "queue_seconds": LatencyHistogram("sglang:queue_time_seconds"),
        "prefill_seconds": LatencyHistogram(
            "sglang:per_stage_req_latency_seconds", (("stage", "prefill_forward"),)
        ),
    }

    @property
    def on_cpu(self) -> bool:
        """Launched on the CPU: no CUDA GPU on this machine."""
        return not gpu_present()

    @property
    def python(self) -> str:
        """The interpreter SGLang runs in: `python:` from the config, else kvscope's own SGLang
        venv of the flavour this machine takes (CPU or CUDA)."""
        if self.config.python:
            return self.config.python
        return str(venv_python(sglang_install.venv_root(cpu=self.on_cpu)))

    def install(self, report: Report) -> None:
        if self.config.url or self.config.python:
            return
        if not sglang_install.complete(cpu=self.on_cpu):
            report(f"installing SGLang {sglang_install.VERSION} ({self.describe_flavour()})")
        sglang_install.install(report, cpu=self.on_cpu)

    def describe_flavour(self) -> str:
        return "CPU engine, no CUDA GPU here" if self.on_cpu else "CUDA build"

    @property
    def model_path(self) -> str:
        # On a GPU machine the embedded model's converted folder serves here too.
        return self.config.model or str(model.model_dir())

    @property
    def output_dir(self) -> Path:
        return self.config.output_dir or paths.state_dir() / "sglang"

    def endpoints(self) -> Endpoints:
        c = self.config
        if c.url:
            return Endpoints(
                base_url=self.base_url,
                metrics_url=c.metrics_url or f"{self.base_url}/metrics",
                kv_events=c.kv_events_endpoint,
            )
        port = c.kv_events_port
        return Endpoints(
            base_url=self.base_url,
            metrics_url=f"{self.base_url}/metrics",
            kv_events=f"tcp://127.0.0.1:{port}" if c.kv_events else None,
            kv_events_replay=f"tcp://127.0.0.1:{port + 1}" if c.kv_events else None,
        )

    def launch(self) -> Launch | None:
        c = self.config
        if c.url:
            return None
        out = self.output_dir
        argv = [
            self.python, "-m", "sglang.launch_server",
            "--model-path", self.model_path,
            "--host", c.host,
            "--port", str(c.port),
            "--context-length", str(c.context_length),
            "--enable-cache-report",
            "--enable-metrics",
            "--enable-request-time-stats-logging",
            "--export-metrics-to-file",
            "--export-metrics-to-file-dir", str(out / "request_metrics"),
            "--log-requests",
            "--log-requests-level", str(c.request_log_level),
            "--log-requests-format", "json",
            "--log-requests-target", str(out / "request_logs"),
            "--tokenizer-metrics-allowed-custom-labels", AGENT_LABEL,
            "--radix-eviction-policy", c.eviction_policy,
        ]  # fmt: skip
        if c.eviction_policy_config:
            policy = json.dumps(c.eviction_policy_config, separators=(",", ":"))
            argv += ["--radix-eviction-policy-config", policy]
        if c.served_model_name:
            argv += ["--served-model-name", c.served_model_name]
        if not c.prefix_cache:
            argv.append("--disable-radix-cache")
        capacity = c.kv_capacity_tokens
        if capacity is None and self.on_cpu:
            capacity = CPU_DEFAULT_CAPACITY
        if capacity is not None:
            argv += ["--max-total-tokens", str(capacity)]
        if c.page_size is not None:
            argv += ["--page-size", str(c.page_size)]
        dtype = self.dtype_choice().dtype
        if dtype != "auto":
            argv += ["--dtype", dtype]
        if c.hierarchical_cache:
            argv.append("--enable-hierarchical-cache")
        ep = self.endpoints()
        if ep.kv_events:
            events = {
                "publisher": "zmq",
                "endpoint": ep.kv_events,
                "bind": True,  # the publisher binds on loopback; subscribers connect
                "replay_endpoint": ep.kv_events_replay,
                "topic": "kv-events",
            }
            argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"))]
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"}
        if self.on_cpu:
            # the CPU engine; torch_native attention (the x86 default, intel_amx, calls native
            # kernels); an idle scheduler that sleeps instead of polling (~90% of a core)
            argv += [
                "--device", "cpu", "--attention-backend", "torch_native",
                "--disable-cuda-graph", "--sleep-on-idle",
            ]  # fmt: skip
            env["SGLANG_USE_CPU_ENGINE"] = "1"
            # On SIGTERM SGLang sleeps 5 s "to let GPU activity settle" before py-spy and CUDA
            # core dumps: neither exists on the CPU (no py-spy in its venv, no CUDA); stops take
            # ~2 s instead of ~7 s.
            env["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] = "0"
            env["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] = "0"
            if c.python is None:
                env.update(cpu_threads(os.cpu_count()))
        argv += list(c.extra_args)
        return Launch(tuple(argv), tuple({**env, **c.env}.items()))

    def request_tags(
        self, request_uuid: str, agent_id: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        # rid is echoed as the response id and joins the export file and request logs;
        # session_id reaches BlockStored events: the request_uuid there attributes each stored
        # block to its request. Never extra_key/cache_salt: they split the tree. x-request-id:
        # the one name sglang-router passes on (it drops rid and session_id), which a replica
        # logs beside its own rid (engines.deployment, finalize.replicas).
        body = {"rid": request_uuid, "session_id": request_uuid}
        headers = {REQUEST_ID_HEADER: request_uuid}
        if not agent_id:  # no agent named: no label (never an empty one)
            return body, headers
        labels = json.dumps({AGENT_LABEL: agent_id}, separators=(",", ":"))
        return body, {**headers, LABEL_HEADER: labels}

    def priority_fields(self, priority: int) -> dict[str, Any]:
        # A top-level int, kept with priority scheduling off (kvscope never turns it on: it
        # reorders and preempts); the radix cache's `priority` policy evicts low values first.
        return {"priority": int(priority)}

    def priority_eviction(self, base_url: str, headers: Mapping[str, str]) -> str | None:
        # The running server's own arguments (an attached one's too); the config's when the
        # server does not say.
        policy = self.config.eviction_policy if self.config.kind == "sglang" else None
        try:
            reply = httpx.get(f"{base_url}/get_server_info", headers=dict(headers), timeout=10)
            policy = reply.json().get("radix_eviction_policy", policy)
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        if policy == "priority":
            return None
        return (
            "SGLang evicts by the calls' priority only with --radix-eviction-policy priority "
            f"(engine.eviction_policy: priority); this server's is {policy or 'unknown'}"
        )

    def prompt_ids_fields(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return sglang_ids.request_fields(body)

    @classmethod
    def reply_prompt_ids(cls, reply: Mapping[str, Any]) -> list[int] | None:
        return sglang_ids.prompt_ids(reply)

    prompt_ids_edit_runs = sglang_ids.EDITS_RUNS
    # SGLang 0.5.23's serving_chat._handle_last_assistant_message: a last assistant message with
    # string content becomes a user message unless the call asks to continue_final_message
    chat_trailing_assistant_as_user = True

    @classmethod
    def without_prompt_ids(cls, data: bytes, chunk: Mapping[str, Any] | None) -> bytes | None:
        return sglang_ids.without_ids(data, chunk)

    @classmethod
    def may_be_prompt_ids_only(cls, event: bytes) -> bool:
        return sglang_ids.may_be_added(event)

    def exported_timings(self) -> dict[str, dict[str, float | None]]:
        """From --export-metrics-to-file: rid -> queue / prefill / decode ms (the rid is ours)."""
        out: dict[str, dict[str, float | None]] = {}
        folder = self.output_dir / "request_metrics"
        for path in sorted(folder.glob("sglang-request-metrics-*.log")):
            for line in path.read_text(errors="replace").splitlines():
                rid, timings = export_line_timings(line)
                if rid:
                    out[rid] = timings
        return out

    def preflight(self) -> None:
        c = self.config
        if c.url:
            return
        if c.hierarchical_cache and self.on_cpu:  # pool_host calls torch.cuda.cudart()
            raise ConfigError(
                "hierarchical_cache (SGLang's HiCache) needs a CUDA GPU: SGLang 0.5.23 fails to "
                "start it on the CPU; set hierarchical_cache: false here"
            )
        if c.python is None and not sglang_install.complete(cpu=self.on_cpu):
            raise EngineNotInstalled(
                f"SGLang ({self.describe_flavour()}) is not installed in "
                f"{sglang_install.venv_root(cpu=self.on_cpu)}; run `kvscope engine install "
                "--engine sglang`"
            )
        if not importable(self.python, "sglang"):
            raise EngineNotInstalled(
                f"SGLang is not importable by {self.python}; set `python:` to an interpreter "
                "that has it, or attach to a running server with `url:`"
            )
        if not Path(self.model_path).exists() and c.model is None:
            raise ConfigError(f"model path {self.model_path} does not exist")
        require_free_port(c.host, c.port, "engine HTTP")
        if c.kv_events:
            require_free_port("127.0.0.1", c.kv_events_port, "KV events")
            require_free_port("127.0.0.1", c.kv_events_port + 1, "KV events replay")
        for sub in ("request_metrics", "request_logs"):
            (self.output_dir / sub).mkdir(parents=True, exist_ok=True)

    def version(self) -> str | None:
        code = "import importlib.metadata as m; print(m.version('sglang'))"
        try:
            out = subprocess.run([self.python, "-c", code], capture_output=True, text=True)
        except OSError:
            return None
        return out.stdout.strip() or None

    def dtype_choice(self) -> DtypeChoice:
        # On the CPU as for vLLM CPU: bfloat16 only where the CPU computes it natively.
        if not self.on_cpu:
            return super().dtype_choice()
        return choose_dtype(self.config.dtype, read_cpu(engine_env=self.config.env))

    def model_facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"model_id": self.model_path}
        if Path(self.model_path).is_dir():
            facts.update(model.hf_folder_facts(Path(self.model_path)))
        facts["context_length"] = self.config.context_length
        return facts

    @classmethod
    def runtime_facts(cls, families: Iterable[Metric]) -> dict[str, Any]:
        gauges = {
            f.name: f.samples[0].value
            for f in families
            if f.name in ("sglang:max_total_num_tokens", "sglang:page_size") and f.samples
        }
        if not gauges:
            return {}
        total, page = gauges.get("sglang:max_total_num_tokens"), gauges.get("sglang:page_size")
        return {
            "capacity_tokens": int(total) if total is not None else None,
            "block_size": int(page) if page is not None else None,
            "kv_cache_dtype": None,  # not in SGLang's metrics; see the launch command
        }


def export_line_timings(line: str) -> tuple[str | None, dict[str, float | None]]:
    """One request-metrics export line -> (rid, timings in ms). Malformed lines give (None, {})."""
    try:
        rec = json.loads(line)
        params = json.loads(rec.get("request_parameters") or "{}")
    except (json.JSONDecodeError, TypeError):
        return None, {}
    rid = params.get("rid") if isinstance(params, dict) else None
    rid = rid if isinstance(rid, str) else rec.get("id")

    def ms(a: str, b: str) -> float | None:
        x, y = rec.get(a), rec.get(b)
        return None if x is None or y is None else (y - x) * 1000

    queue = rec.get("queue_time")
    return rid, {
        "queue_ms": None if queue is None else queue * 1000,
        # scheduler: entered the forward pass -> prefill done; then -> the request finished
        "prefill_ms": ms("forward_entry_time", "prefill_finished_time"),
        "decode_ms": ms("prefill_finished_time", "request_finished_ts"),
    }
