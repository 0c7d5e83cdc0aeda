"""A capture session: the engine, kvscope's collectors and a run directory, open while a workload
runs. Every call the process makes to the engine inside `session.intercept()` becomes a row of
the request stream.

    with CaptureSession(cfg) as session:   # engine up (or reused / attached), cold cache,
        ...drive the workload...            # /metrics sampler, KV event listener, MLflow run
    # closed: collectors stopped, streams flushed, metrics.parquet written, engine stopped

The engine may be a deployment (config `deployment`: replicas behind a router, kvscope.target):
then the calls go to the router and every replica gets its own collectors, streams under
replicas/<name>/.

What to do with the run directory afterwards is not the session's business: finalize, analyze
and publish read only the directory. A failure while the session opens closes what was opened
already; `measuring` says whether anything was (a run directory with streams to keep).

The run is local-first: an MLflow tracking server that does not answer at open (checked in
seconds, before the engine starts) or that fails to open the run leaves `tracking` None with
`offline` saying why (one warning line); everything is still measured and written to the run
directory, and `kvscope log RUN` uploads it later (run.json keeps the MLflow params for it).
The MLflow run opens with the session where the process has MLflow loaded, else at its close
or when a program needs it (`child_env`), started at the session's start (session_run.py).

An app's own calls are captured with `session.intercept()` (probe/intercept.py: every call the
process makes to the engine, through the OpenAI SDK, ChatOpenAI or httpx, is a row); a program
in another process gets the same through `session.child_env()` (probe/child.py), its streams
written beside the session's and merged on close.
"""

import json
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from kvscope import environment
from kvscope.collect.kv_events import KvEventListener
from kvscope.collect.scraper import MetricsScraper
from kvscope.config import ExperimentConfig, as_dict, config_hash
from kvscope.engines import ENGINES, METRIC_FAMILIES, auth, make_engine, speaking_as
from kvscope.engines.base import Capabilities, Engine
from kvscope.engines.detect import detect, fetch_metrics
from kvscope.engines.runtime import RunningEngine, reset_cache
from kvscope.engines.watch import EngineDeath, EngineWatch
from kvscope.errors import EngineError, WriteError
from kvscope.probe import child, raw_rows
from kvscope.probe.intercept import Interceptor
from kvscope.probe.mlflow_store import local_store_uri, unreachable
from kvscope.probe.params import mlflow_params
from kvscope.probe.streams import CallStreams
from kvscope.probe.tokens import ChatTokenizer
from kvscope.probe.wire import CallContext, RunInfo
from kvscope.records import prompt_columns
from kvscope.records import run_dir as files
from kvscope.records.kv_events import KV_EVENTS_ARROW, KV_SUMMARY
from kvscope.records.metrics import METRICS_JSONL, METRICS_PARQUET, labelled
from kvscope.records.requests import RequestRecord
from kvscope.session_run import SessionRun
from kvscope.target import (
    Cache,
    Target,
    hints_unheeded,
    open_target,
    opening,
    router_samples,
)

if TYPE_CHECKING:
    from kvscope.probe.tracing import TrackingRun


def _warn(message: str) -> None:
    print(f"kvscope: warning: {message}", file=sys.stderr, flush=True)


@dataclass
class Hooks:
    """Progress callbacks for the CLI (all optional)."""

    on_stage: Callable[[str], None] = lambda _: None
    on_warning: Callable[[str], None] = _warn
    on_call: Callable[[], None] = lambda: None
    on_workflow_done: Callable[[], None] = lambda: None


class CaptureSession:
    """Engine handle + collectors + run directory + request stream writer, from open to close."""

    def __init__(self, cfg: ExperimentConfig, hooks: Hooks | None = None) -> None:
        self.cfg, self.hooks = cfg, hooks or Hooks()
        runs_dir = cfg.runs_dir.resolve()
        runs_dir.mkdir(parents=True, exist_ok=True)
        self.run_id, self.run_dir = files.new_run(runs_dir, cfg.name)
        (self.run_dir / files.CONFIG_YAML).write_text(yaml.safe_dump(as_dict(cfg), sort_keys=False))
        self.engine: Engine = make_engine(cfg.engine)
        # whose request tags and cache reset the calls use: an attached server's detected family
        self.wire: Engine = self.engine
        self.mlflow = SessionRun(cfg, self.run_id, self.engine.name, self.hooks.on_stage,
                                 self.hooks.on_warning)  # fmt: skip
        self._measuring = False
        self._stack = ExitStack()
        self._streams: CallStreams | None = None
        self._context: CallContext | None = None
        self.base_url: str | None = None  # the engine's OpenAI base URL (`.../v1`), once open
        self.model: str | None = None  # the served model name, once open
        self._target: Target | None = None
        self._scrapers: dict[str | None, MetricsScraper] = {}  # by cache (replica) name
        self._listeners: dict[str | None, KvEventListener] = {}
        self._watches: dict[str | None, EngineWatch] = {}  # each replica's, and "router"
        self._router_start: list[dict[str, Any]] | None = None
        self._closed = False

    @property
    def tracking(self) -> "TrackingRun | None":
        """The run's MLflow run, once open (session_run.py: at open or at close)."""
        return self.mlflow.tracking

    @property
    def offline(self) -> str | None:
        """Why the run has no MLflow run (it is kept locally; `kvscope log RUN` uploads it)."""
        return self.mlflow.offline

    @property
    def measuring(self) -> bool:
        """Whether the session got as far as its run directory's streams: then what it holds
        is kept (with or without an MLflow run)."""
        return self._measuring

    @property
    def engine_death(self) -> EngineDeath | None:
        """When and how the engine (a replica, the router) died during the session; None while
        it serves (or unknown)."""
        for name, watch in self._watches.items():
            if watch.death is not None:
                who = f"{name}: " if name else ""
                return replace(watch.death, reason=who + watch.death.reason)
        return None

    def engine_gone(self) -> bool:
        """Whether the engine (any replica, the router) is known dead: the workload stops."""
        return any(w.gone() for w in self._watches.values())

    @property
    def write_error(self) -> WriteError | None:
        """The first run file the disk refused (a full disk): a workload stops sending then."""
        return self._streams.write_error if self._streams is not None else None

    def should_stop(self) -> bool:
        """Whether a workload should stop sending: the engine died, or rows cannot be written."""
        return self.write_error is not None or self.engine_gone()

    @property
    def context(self) -> CallContext:
        """The rows' constants and where they go: what an Interceptor of this session uses."""
        if self._context is None:
            raise RuntimeError("the capture session is not open")
        return self._context

    def intercept(self) -> Interceptor:
        """Capture this process's calls to the engine while the returned context is entered."""
        assert self._streams is not None and self.base_url is not None
        streams = self._streams
        return Interceptor(self.wire, self.base_url, self.context, on_tool=streams.tool,
                           on_error=streams.invocation_error)  # fmt: skip

    def child_env(self) -> dict[str, str]:
        """Environment additions that make a Python program capture its calls into this session
        (probe/child.py) and find the engine (OPENAI_BASE_URL, OPENAI_API_KEY, KVSCOPE_MODEL)."""
        assert self.base_url is not None and self.model is not None
        self.mlflow.ensure()  # its traces (autolog) go to the run's experiment
        model_dir = self.engine.model_facts().get("path")
        spec = child.ChildSpec.of(
            self.context, self.cfg, self.wire.config, self.run_dir, self.base_url, model_dir
        )
        t = self.tracking
        key = auth.api_key(self.cfg.engine.api_key_env)
        return child.environment(
            spec, self.model, t and t.tracking_uri, t and t.experiment_id, api_key=key
        )

    def open(self) -> "CaptureSession":
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def _open(self) -> None:
        cfg, run_dir, stage = self.cfg, self.run_dir, self.hooks.on_stage
        uri = cfg.tracking.tracking_uri or local_store_uri(cfg.runs_dir)
        if problem := unreachable(uri):  # before the engine: in seconds, not minutes of retries
            self.mlflow.go_offline(
                f"{problem}; the run is kept locally (kvscope log RUN uploads it)"
            )
        self.engine.install(lambda line: stage(f"installing {self.engine.name}: {line}"))
        stage(opening(cfg, self.engine))
        self._target = target = open_target(cfg, self.engine, run_dir, self._stack)
        handle = target.first
        stage("detecting engine capabilities")
        keyed = auth.headers(cfg.engine.api_key_env)
        caps = detect(handle.endpoints, METRIC_FAMILIES, headers=keyed)
        self.wire = speaking_as(self.engine, caps.family)
        if why := hints_unheeded(cfg, target, self.wire, keyed):
            stage(f"warning: eviction hints ({cfg.eviction_hints}) change nothing here: {why}")
        facts = _runtime_facts(caps, handle, keyed)
        env = environment.collect(
            self.engine, launch=handle.launch, capabilities=caps, runtime=facts
        )
        params = mlflow_params(cfg, caps.models[0], self.engine.version(), facts, env)
        chat = _chat_tokenizer(self.engine, self.wire)  # may fail: before anything is kept
        self._write_run_json(target, env, cache_reset=self._cold_start(target), params=params)
        ids = chat is not None or self.wire.gives_prompt_ids()
        self._streams = CallStreams(run_dir, tokens=ids, payloads=cfg.tracking.traces)
        self._measuring = True  # from here a failure concludes the run: its streams exist
        self.mlflow.open(params)
        self.base_url, self.model = target.base_url + "/v1", caps.models[0]
        self._context = self._streams.context(
            self._run_info(caps, env), chat, self._store_prompts, cfg.eviction_hints
        )
        self._streams.on_row = self._on_row
        for cache in target.caches:
            self._start_collectors(caps, cache)
            proc = cache.handle.process
            health = f"{cache.handle.endpoints.base_url}{self.engine.health_path}"
            self._watches[cache.name] = EngineWatch(
                health, exit_code=proc.exit_code if proc else None, headers=keyed
            ).start()
        if target.router is not None:
            self._router_start = router_samples(target.router)
            r = target.router.process
            self._watches["router"] = EngineWatch(
                target.router.base_url + "/health", exit_code=r.exit_code if r else None
            ).start()

    @property
    def _store_prompts(self) -> bool:
        return self.cfg.app.store_prompts if self.cfg.app else self.cfg.workload.store_prompts

    def log_params(self, params: dict[str, Any]) -> None:
        """More MLflow params of the run."""
        self.mlflow.log_params(params)

    def _on_row(self, record: RequestRecord) -> None:
        self.hooks.on_call()

    def _start_collectors(self, caps: Capabilities, cache: Cache) -> None:
        """One cache's /metrics sampler and KV event listener, its streams in its folder."""
        ep, folder = cache.handle.endpoints, cache.folder
        folder.mkdir(parents=True, exist_ok=True)
        if caps.family and caps.metrics and ep.metrics_url:
            scraper = self._scrapers[cache.name] = MetricsScraper(
                ENGINES[caps.family],
                ep.metrics_url,
                self.run_id,
                interval_s=self.cfg.metrics_interval_s,
                api_key_env=self.cfg.engine.api_key_env,
                instant_path=folder / METRICS_JSONL,
            )
            scraper.start()  # its first sample precedes the first request
        if caps.kv_events and ep.kv_events:
            listener = self._listeners[cache.name] = KvEventListener(
                ep.kv_events,
                folder / KV_EVENTS_ARROW,
                bind=ep.kv_events_subscriber_binds,
                replay_endpoint=ep.kv_events_replay,
            )
            listener.start()  # connected before the first request

    def close(self) -> None:
        """Stop the collectors, flush the streams, stop the engine (once; also after a failure)."""
        if self._closed:
            return
        self._closed = True
        for watch in self._watches.values():
            watch.stop()  # before the engine is stopped on purpose
        try:
            if self._streams is not None:
                if self._context is not None:  # a program's calls the lite probe recorded
                    raw_rows.replay_parts(self.run_dir, self.wire, self._context)
                self._streams.close()  # and the rows of programs it ran (child_env), merged
            self._stop_collectors()
        finally:
            for scraper in self._scrapers.values():
                scraper.discard()  # its temporary folder, whether or not write() emptied it
            self._stack.close()  # the prompt-token stream, then the engine
        if self._measuring:
            self.mlflow.ensure()
        if self._streams is not None:  # where calls ended: "inline" = on the app's thread
            self._record({"background": asdict(self._streams.background.counts)})
        tokenized = prompt_columns.tokenized_on(self.run_dir)
        if tokenized:  # where calls were tokenized: "app" = the worker's queue was full
            self._record({"prompt_tokenization": tokenized})
        errors = {n: s.error for n, s in self._scrapers.items() if s.error}
        if errors:
            self._record({"scrape_error": "; ".join(f"{n}: {e}" if n else e
                                                   for n, e in errors.items())})  # fmt: skip

    def _stop_collectors(self) -> None:
        """Every cache's series and KV event summary written into its folder; the router's
        /metrics, start and end, into router_metrics.json."""
        target = self._target
        folders = {c.name: c.folder for c in target.caches} if target else {None: self.run_dir}
        for name, scraper in self._scrapers.items():
            scraper.stop()
            written = scraper.write(folders[name] / METRICS_PARQUET)
            if written and name is not None:  # a replica's samples say which replica
                labelled(written[0], replica=name)
        for name, listener in self._listeners.items():
            summary = listener.stop()
            (folders[name] / KV_SUMMARY).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
        if target is not None and target.router is not None:
            doc = {"start": self._router_start, "end": router_samples(target.router)}
            (self.run_dir / files.ROUTER_METRICS).write_text(json.dumps(doc, indent=2) + "\n")

    def __enter__(self) -> "CaptureSession":
        return self.open()

    def __exit__(self, *_: object) -> None:
        self.close()

    def exported_timings(self) -> dict[str, dict[str, float | None]]:
        """The engine's own per-request timings, where it exports them (SGLang), by rid."""
        return self.engine.exported_timings()

    def _cold_start(self, target: Target) -> str:
        """Empty the prefix cache of every replica (an `engine up` engine holds earlier runs')."""
        if not self.cfg.cold_start:
            return "kept (cold_start: false)"
        notes = []
        for cache in target.caches:
            try:
                note = reset_cache(self.wire, cache.handle.endpoints.base_url)
            except EngineError as err:
                note = f"not reset: {err}"
            if note:
                notes.append(f"{cache.name}: {note}" if cache.name else note)
        return "; ".join(notes) or "emptied before the workload"

    def _run_info(self, caps: Capabilities, env: dict[str, Any]) -> RunInfo:
        digest = env.get("model", {}).get("chat_template_sha256")
        app = self.cfg.app
        return RunInfo(
            benchmark_run_id=self.run_id,
            experiment_name=self.cfg.tracking.experiment,
            configuration_hash=config_hash(self.cfg),
            workflow_type=app.workflow_type if app else self.cfg.workload.workflow,
            workflow_concurrency=None if app else self.cfg.workload.concurrency,
            model_name=caps.models[0],
            chat_template_name=f"sha256:{digest[:12]}" if digest else None,
        )

    def _write_run_json(
        self, target: Target, env: dict[str, Any], cache_reset: str, params: dict[str, Any]
    ) -> None:
        handle = target.first
        launch = handle.launch.shell() if handle.launch else None
        run: dict[str, Any] = {
            "mlflow_params": params,  # what the MLflow run was (or `kvscope log` will be) given
            "benchmark_run_id": self.run_id,
            "configuration_hash": config_hash(self.cfg),
            "config": as_dict(self.cfg),
            "launch_command": launch,
            "cache_reset": cache_reset,
            "environment": env,
        }
        if target.router is not None:  # a deployment: every replica's command and the router's
            run["launch_commands"] = target.launch_commands()
        (self.run_dir / files.RUN_JSON).write_text(json.dumps(run, indent=2, default=str))
        (self.run_dir / files.ENVIRONMENT_JSON).write_text(json.dumps(env, indent=2, default=str))
        (self.run_dir / files.LAUNCH_COMMAND).write_text(target.launch_text())

    def _record(self, capture: dict[str, Any]) -> None:
        """Add what the collectors reported at close to run.json's `capture`."""
        run = files.read_run_json(self.run_dir)
        run["capture"] = (run.get("capture") or {}) | capture
        (self.run_dir / files.RUN_JSON).write_text(json.dumps(run, indent=2, default=str))


def _runtime_facts(
    caps: Capabilities, handle: RunningEngine, headers: dict[str, str]
) -> dict[str, Any]:
    """What the engine's /metrics says about itself (KV capacity, block size, ...)."""
    if not caps.family:
        return {}
    with httpx.Client(timeout=10, headers=headers) as client:
        families = fetch_metrics(client, handle.endpoints.metrics_url) or []
    return ENGINES[caps.family].runtime_facts(families)


def _chat_tokenizer(engine: Engine, wire: Engine) -> ChatTokenizer | None:
    """The model's tokenizer and chat template where readable, rendering as `wire` serves chats."""
    path, as_user = engine.model_facts().get("path"), wire.chat_trailing_assistant_as_user
    folder = Path(path) if path else None  # from_model_dir: None where it holds no tokenizer
    return folder and ChatTokenizer.from_model_dir(folder, trailing_assistant_as_user=as_user)
