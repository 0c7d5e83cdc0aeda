"""`kvscope profile -- python app.py`: the probe inside a program kvscope did not start itself.

The profiling process writes a spec (`capture.json` in the run directory) and starts the program
with `environment(...)`: the OpenAI SDK's own variables pointing at the engine (OPENAI_BASE_URL,
OPENAI_API_KEY) and KVSCOPE_MODEL, KVSCOPE_CAPTURE naming the spec, and kvscope's boot folder
first on PYTHONPATH. Python imports that folder's `sitecustomize` at startup in every
interpreter of the program (subprocesses included); it calls `attach()`, which intercepts the
process's calls (probe/intercept.py) into part files of the run's streams (probe/streams.py),
and then runs any `sitecustomize` of the program's own environment that it shadowed.

Each attached process leaves `probe.<pid>.json` (its argv and interpreter) in the run directory:
the profiling process reads those to tell "the program made no calls" from "the probe never
loaded".

An interpreter without kvscope (an app in its own virtualenv) gets the lite probe instead
(probe/lite.py): `KVSCOPE_PROBE_PATH` names a folder holding only a link to kvscope's package
(`probe_path()`, in kvscope's cache), and the spec carries the engine's tags as a template
(`ChildSpec.wire`: probe/raw_call.WireTemplate), so that nothing of kvscope's dependencies is
needed there.
"""

import atexit
import contextlib
import hashlib
import json
import logging
import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvscope.config import EngineConfig, ExperimentConfig, HintPolicy
from kvscope.engines import make_engine
from kvscope.paths import cache_dir
from kvscope.probe.lite import PATH_ENV, mark
from kvscope.probe.raw_call import AGENT_MARK, REQUEST_MARK, WireTemplate
from kvscope.probe.wire import CallContext, RunInfo

if TYPE_CHECKING:
    from kvscope.probe.streams import CallStreams

log = logging.getLogger(__name__)
CAPTURE_ENV = "KVSCOPE_CAPTURE"
MODEL_ENV = "KVSCOPE_MODEL"
SPEC_FILE = "capture.json"
BOOT_DIR = Path(__file__).parent / "boot"
MARKER_GLOB = "probe.*.json"


@dataclass(frozen=True)
class ChildSpec:
    """What a program's processes need to capture into a session."""

    run: RunInfo
    engine: dict[str, Any]  # the EngineConfig, as JSON (for the engine's request tags)
    base_url: str
    run_dir: str
    model_dir: str | None  # the model's tokenizer and chat template, where kvscope can read them
    store_prompts: bool
    traces: bool
    eviction_hints: HintPolicy | None = None  # probe/hints.py: each call's engine priority
    wire: dict[str, Any] | None = None  # the engine's tags, for the lite probe (WireTemplate)

    @classmethod
    def of(
        cls,
        ctx: CallContext,
        cfg: ExperimentConfig,
        engine: EngineConfig,
        run_dir: Path,
        base_url: str,
        model_dir: str | None,
    ) -> "ChildSpec":
        run = RunInfo(**{k: getattr(ctx, k) for k in RunInfo.__dataclass_fields__})
        store = cfg.app.store_prompts if cfg.app else cfg.workload.store_prompts
        return cls(
            run,
            engine.model_dump(mode="json"),
            base_url,
            str(run_dir),
            model_dir,
            store,
            cfg.tracking.traces,
            cfg.eviction_hints,
            asdict(wire_template(engine)),
        )

    def write(self) -> Path:
        path = Path(self.run_dir) / SPEC_FILE
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def read(cls, path: Path) -> "ChildSpec":
        data = json.loads(path.read_text())
        return cls(**{**data, "run": RunInfo(**data["run"])})


def wire_template(engine: EngineConfig) -> WireTemplate:
    """The engine's request tags with the lite probe's marks in place (probe/raw_call.py)."""
    made = make_engine(engine)
    tags = made.request_tags
    (body, headers), (body0, headers0) = tags(REQUEST_MARK, AGENT_MARK), tags(REQUEST_MARK, "")
    field = next((k for k, v in made.priority_fields(2).items() if v == 2), None)
    ids = made.prompt_ids_module if made.gives_prompt_ids() else None
    return WireTemplate(body, headers, body0, headers0, field, ids)


def probe_path() -> Path:
    """A folder holding only a link to this kvscope's package (for the lite probe's sys.path:
    kvscope's own dependencies stay out of the app's interpreter)."""
    package = Path(__file__).resolve().parents[1]
    key = hashlib.sha256(str(package).encode()).hexdigest()[:12]
    folder = cache_dir() / "probe-path" / key
    link = folder / "kvscope"
    if not (link.is_symlink() and link.resolve() == package):
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f".kvscope.{os.getpid()}"
        temp.unlink(missing_ok=True)
        temp.symlink_to(package, target_is_directory=True)
        os.replace(temp, link)  # atomic: a program starting now sees the old link or the new
    return folder


def environment(
    spec: ChildSpec,
    model: str,
    tracking_uri: str | None,
    experiment_id: str | None = None,
    api_key: str | None = None,
) -> dict[str, str]:
    """The variables a profiled program gets (added to the caller's environment); `api_key`:
    the engine's (engines/auth.py), as OPENAI_API_KEY."""
    path = spec.write()
    python_path = [str(BOOT_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        "OPENAI_BASE_URL": spec.base_url,
        "OPENAI_API_KEY": api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
        MODEL_ENV: model,
        CAPTURE_ENV: str(path),
        "PYTHONPATH": os.pathsep.join(python_path),
    }
    try:
        env[PATH_ENV] = str(probe_path())
    except OSError as err:  # only an interpreter without kvscope misses it (the probe says so)
        log.warning("kvscope: no probe path for apps without kvscope (%s)", err)
    if tracking_uri:  # the app's own MLflow traces (autolog) land in kvscope's store and
        env["MLFLOW_TRACKING_URI"] = tracking_uri  # experiment, where publish links them to
    if experiment_id:  # the run (traces.link_app_traces)
        env["MLFLOW_EXPERIMENT_ID"] = experiment_id
    return env


def attach(spec_path: str) -> None:
    """Capture this process's calls into the session `spec_path` describes (idempotent)."""
    global _ATTACHED
    if _ATTACHED:
        return
    from kvscope.engines import make_engine
    from kvscope.probe.intercept import Interceptor
    from kvscope.probe.streams import CallStreams
    from kvscope.probe.tokens import ChatTokenizer

    spec = ChildSpec.read(Path(spec_path))
    run_dir = Path(spec.run_dir)
    engine = make_engine(EngineConfig.model_validate(spec.engine))
    model_dir = Path(spec.model_dir) if spec.model_dir else None
    trailing = engine.chat_trailing_assistant_as_user
    chat = (
        ChatTokenizer.from_model_dir(model_dir, trailing_assistant_as_user=trailing)
        if model_dir and model_dir.is_dir()
        else None
    )
    ids = chat is not None or engine.gives_prompt_ids()
    streams = CallStreams(run_dir, tokens=ids, payloads=spec.traces, part=mark(run_dir))
    ctx = streams.context(spec.run, chat, spec.store_prompts, spec.eviction_hints)
    Interceptor(engine, spec.base_url, ctx, on_tool=streams.tool,
                on_error=streams.invocation_error).__enter__()  # process-long  # fmt: skip
    # a forked worker (multiprocessing) writes part files of its own pid
    os.register_at_fork(after_in_child=lambda: streams.reopen(mark(run_dir)))
    atexit.register(_close, streams)
    _ATTACHED = True


def _close(streams: "CallStreams") -> None:
    """The program's end: its last calls' rows written (the background thread's queue run).

    A program that dies of Ctrl-C (an uncaught KeyboardInterrupt) is ended by CPython with
    SIGINT after its exit handlers, so that its parent sees "killed by SIGINT" (130), but only if
    no module that runs code at its import (numpy, pandas...) was first imported in an exit
    handler: that clears CPython's flag and the program exits 1. Rows written at exit can import
    such modules (pyarrow's pandas shim), so here the probe ends such a program as CPython would
    have: streams flushed, SIGINT with its default action."""
    streams.close()
    dying = getattr(sys, "last_type", None)
    if isinstance(dying, type) and issubclass(dying, KeyboardInterrupt):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


_ATTACHED = False


def attached_processes(run_dir: Path) -> list[dict[str, Any]]:
    """The processes of a profiled program in which the probe loaded."""
    out = []
    for path in sorted(run_dir.glob(MARKER_GLOB)):
        try:
            out.append(json.loads(path.read_text()))
        except ValueError:
            continue
    return out
