"""The engine interface: what kvscope needs from any inference engine, in its own terms."""

import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kvscope.config import EngineConfig
from kvscope.engines.cpu import DtypeChoice

# Flag or variable names whose values are secrets: --api-key, --hf-token, HF_TOKEN, *_SECRET...
_SECRET_FLAG = re.compile(r"(api[-_]?key|secret|password|(^|[-_])token$)", re.IGNORECASE)
REDACTED = "***"

# kvscope's names for an engine's instant values (gauges and counters), read from one scrape.
INSTANT_VALUES = (
    "kv_used_tokens",  # KV slots held by running requests (not the evictable cached ones)
    "kv_evictable_tokens",  # cached by no running request: kept for reuse until evicted
    "kv_capacity_tokens",
    "kv_usage",  # fraction 0..1
    "cache_hit_rate",
    "running_requests",
    "queued_requests",
    "gen_throughput",  # tokens/s
    "prompt_tokens_total",
    "cached_tokens_total",
    "generation_tokens_total",
    "evicted_tokens_total",
)
COUNTERS = (
    "prompt_tokens_total",
    "cached_tokens_total",
    "generation_tokens_total",
    "evicted_tokens_total",
)
# A fraction summed over label sets (ranks, engines) would exceed 1: these are averaged.
RATIOS = frozenset({"kv_usage", "cache_hit_rate"})
LATENCIES = ("ttft_seconds", "e2e_seconds", "queue_seconds", "prefill_seconds", "decode_seconds")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# The header that names a request across hops: vLLM takes it as the request id (before the body's
# request_id), and both routers forward it (their --request-id-headers).
REQUEST_ID_HEADER = "x-request-id"


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


@dataclass(frozen=True)
class LatencyHistogram:
    """An engine's histogram family, optionally only its series with these label values."""

    family: str
    where: tuple[tuple[str, str], ...] = ()

    def matches(self, sample: str, labels: Mapping[str, str]) -> bool:
        return any(sample == self.family + s for s in _HISTOGRAM_SUFFIXES) and all(
            labels.get(k) == v for k, v in self.where
        )


class Engine(ABC):
    """One engine kind; everything engine-specific (flags, metric names, quirks) is in its file."""

    name: ClassVar[str]
    health_path: ClassVar[str] = "/health"
    metric_prefix: ClassVar[str] = ""
    cache_reset_path: ClassVar[str | None] = None  # POST empties the prefix cache; None: no way
    # kvscope instant value (INSTANT_VALUES) -> this engine's sample that gives it as is, summed
    # over label sets. A name missing here is derived (derived_values) or not exposed (None).
    metric_samples: ClassVar[dict[str, str]] = {}
    # kvscope latency (LATENCIES) -> this engine's histogram; missing = not exposed
    latency_histograms: ClassVar[dict[str, LatencyHistogram]] = {}

    @classmethod
    def cache_reset_ok(cls, reply: httpx.Response) -> bool:
        """Whether a 200 reply to cache_reset_path means the cache is empty now."""
        return True

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

    def exported_timings(self) -> dict[str, dict[str, float | None]]:
        """request id -> server timings from files the engine wrote during the run (if any)."""
        return {}

    @classmethod
    def server_timings(cls, final_chunk: dict[str, Any] | None) -> dict[str, float | None] | None:
        """queue_ms / prefill_ms / decode_ms the engine reported for one request, if it does."""
        return None

    def request_tags(
        self, request_uuid: str, agent_id: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """(extra body fields, extra headers) that carry kvscope's ids into the engine."""
        return {}, {}

    def priority_fields(self, priority: int) -> dict[str, Any]:
        """Body fields that give a call this eviction priority (probe/hints.py); {} where the
        engine's prefix cache has no such lever (the default: vLLM's is LRU only)."""
        return {}

    def priority_eviction(self, base_url: str, headers: Mapping[str, str]) -> str | None:
        """Whether the server at `base_url` evicts its prefix cache by the calls' priority:
        None when it does, else why not (the default: no per-request priority at all)."""
        return f"{self.name} has no per-request eviction priority (its prefix cache is LRU)"

    def prompt_ids_fields(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Body fields that make this engine return the prompt's exact token ids with its reply
        to `body`; {} where it cannot (the default), or not without changing what the app reads
        beyond what `without_prompt_ids` undoes. A field the app set itself is never replaced."""
        return {}

    # The standard-library module whose request_fields / prompt_ids / without_ids the three
    # methods around this use (vllm_ids.py, sglang_ids.py), for the lite probe, which cannot
    # load the engine class in an app's interpreter; None: this engine returns no prompt ids.
    prompt_ids_module: ClassVar[str | None] = None

    def gives_prompt_ids(self) -> bool:
        """Whether this engine returns a prompt's token ids when asked (prompt_ids_fields)."""
        return bool(self.prompt_ids_fields({"messages": []}))  # a chat call's

    @classmethod
    def reply_prompt_ids(cls, reply: Mapping[str, Any]) -> list[int] | None:
        """The prompt's token ids carried by one reply body or streamed chunk; None if none."""
        return None

    @classmethod
    def without_prompt_ids(cls, data: bytes, chunk: Mapping[str, Any] | None) -> bytes | None:
        """`data` (a reply body, or one SSE event whose parsed JSON is `chunk`) as this engine
        sends it when prompt_ids_fields were not asked for; None for an event only they bring."""
        return data

    # whether the engine's chat path serves a conversation that ends with an assistant message
    # as if that message were the user's (probe/tokens.ChatTokenizer.as_served renders it so)
    chat_trailing_assistant_as_user: ClassVar[bool] = False

    # whether `without_prompt_ids(run, None)` edits a run of several whole SSE events exactly as
    # it edits each alone (an edit of every occurrence, byte for byte): the reply is then edited
    # a network read at a time, not an event at a time (probe/reply_edit.py)
    prompt_ids_edit_runs: bool = False

    @classmethod
    def may_be_prompt_ids_only(cls, event: bytes) -> bool:
        """Whether one SSE event's bytes may be an event only prompt_ids_fields bring (it is then
        parsed for `without_prompt_ids`); False: `without_prompt_ids(event, None)` is exact."""
        return False

    def install(self, report: Callable[[str], None]) -> None:
        """Install what launching this engine needs, where kvscope owns the install (its own
        venv and model under the cache); quick when done before, a no-op for an attached server
        or a `python:` of the user's own. `report` gets progress lines."""

    def preflight(self) -> None:
        """Raise one clear error for anything that would make the launch fail (before it)."""

    def version(self) -> str | None:
        return None

    def dtype_choice(self) -> DtypeChoice:
        """The dtype the engine is launched with and why; `auto` leaves it to the engine."""
        requested = self.config.dtype
        if requested == "auto":
            return DtypeChoice(requested, "auto", "auto: the engine's default (the model's dtype)")
        return DtypeChoice(requested, requested, f"engine.dtype: {requested}")

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
    def kvscope_values(cls, families: Iterable[Metric]) -> dict[str, float | None]:
        """INSTANT_VALUES from one scrape, in kvscope's names; None = not exposed.

        A counter whose family is listed with no sample is 0, not None: it is exposed and has
        counted nothing yet. A labelled counter has no sample until its first label set is
        counted (SGLang's `sglang:cached_tokens_total{agent, cache_source}`: the first cache
        hit), and a single-process prometheus_client registry still lists its family (HELP and
        TYPE lines). A family absent from the scrape stays None: this scrape alone cannot tell
        "not exposed" from "not counted yet" (prometheus_client's multiprocess mode, SGLang's,
        lists no family before its first sample); over a run, collect.series.from_first_scrape
        can, from the scrapes that do have it.
        """
        scraped = list(families)
        wanted = {sample: name for name, sample in cls.metric_samples.items()}
        found: dict[str, list[float]] = {}
        for family in scraped:
            if family.type == "counter" and not family.samples:
                name = wanted.get(family.name + "_total")
                if name in COUNTERS:
                    found.setdefault(name, [])
            for sample in family.samples:
                name = wanted.get(sample.name)
                if name is not None:
                    found.setdefault(name, []).append(sample.value)
        values: dict[str, float | None] = dict.fromkeys(INSTANT_VALUES)
        for name, vs in found.items():
            values[name] = sum(vs) / len(vs) if name in RATIOS else sum(vs, 0.0)
        values.update(cls.derived_values(scraped, values))
        return values

    @classmethod
    def derived_values(
        cls, families: list[Metric], direct: Mapping[str, float | None]
    ) -> dict[str, float | None]:
        """Instant values this engine exposes only through others (`direct`: those it gives)."""
        return {}

    @classmethod
    def counters(cls, families: Iterable[Metric]) -> dict[str, float | None]:
        """Engine counters in kvscope's names, summed over label sets; None = not exposed."""
        values = cls.kvscope_values(families)
        return {name: values[name] for name in COUNTERS}

    @classmethod
    def kvscope_name(cls, sample: str, labels: Mapping[str, str]) -> str | None:
        """kvscope's name for one of this engine's samples (a histogram's too), or None."""
        for name, histogram in cls.latency_histograms.items():
            if histogram.matches(sample, labels):
                return name
        return next((k for k, v in cls.metric_samples.items() if v == sample), None)

    @classmethod
    def owns_metrics(cls, families: Iterable[Metric]) -> bool:
        return bool(cls.metric_prefix) and any(
            f.name.startswith(cls.metric_prefix) for f in families
        )


def parse_metrics(text: str) -> list[Metric]:
    """Prometheus text, as every engine serves it on /metrics."""
    return list(text_string_to_metric_families(text))
