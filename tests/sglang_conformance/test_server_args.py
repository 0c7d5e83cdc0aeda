"""SGLang 0.5.23's own argument parser and resolver on the command kvscope launches.

Opt-in (`-m sglang`, scripts/test-sglang.sh creates .venv-sglang); skipped where that venv is
absent. SGLang runs in a subprocess (server_args_probe.py, beside this file) with its own
interpreter.
"""

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvscope.config import EngineConfig
from kvscope.engines.sglang import SglangEngine
from kvscope.errors import KvscopeError

pytestmark = pytest.mark.sglang

PROBE = Path(__file__).with_name("server_args_probe.py")

# Parsed only: prepare_server_args() checks flag names, values and choices, not combinations.
PARSE_CASES: dict[str, dict[str, Any]] = {
    "every-option": dict(
        kv_capacity_tokens=4096,
        page_size=16,
        prefix_cache=False,
        eviction_policy="tlru",
        eviction_policy_config={"threshold": 4096, "next_prompt_estimate": 512},
        request_log_level=2,
        served_model_name="tiny-chat",
    ),
    "radix-and-hicache": dict(
        kv_capacity_tokens=8192, page_size=32, hierarchical_cache=True, eviction_policy="lfu"
    ),
    "defaults-without-kv-events": dict(kv_events=False, request_log_level=3),
}


@pytest.fixture(scope="module")
def model_dir(tiny_model: Path) -> Path:
    return tiny_model


def engine_config(model_dir: Path, **options: Any) -> EngineConfig:
    base: dict[str, Any] = dict(
        kind="sglang",
        model=str(model_dir),
        output_dir=model_dir.parent / f"{model_dir.name}-out",
        port=30123,
        kv_events_port=5611,
        context_length=4096,
    )
    return EngineConfig(**{**base, **options})


def launch_flags(cfg: EngineConfig) -> list[str]:
    """What follows `python -m sglang.launch_server` in kvscope's command."""
    launch = SglangEngine(cfg).launch()
    assert launch is not None
    assert launch.argv[1:3] == ("-m", "sglang.launch_server")
    return list(launch.argv[3:])


def run_probe(
    python: Path, argvs: list[list[str]], *, resolve: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), str(PROBE)],
        input=json.dumps({"argvs": argvs, "resolve": resolve}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def probe(python: Path, argvs: list[list[str]], *, resolve: bool = False) -> dict[str, Any]:
    done = run_probe(python, argvs, resolve=resolve)
    assert done.returncode == 0, f"SGLang refused kvscope's flags:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def parsed(sglang_interpreter: Path, model_dir: Path) -> dict[str, tuple[EngineConfig, dict]]:
    """Each PARSE_CASES config and what SGLang's parser made of kvscope's flags for it."""
    configs = {name: engine_config(model_dir, **opts) for name, opts in PARSE_CASES.items()}
    report = probe(sglang_interpreter, [launch_flags(cfg) for cfg in configs.values()])
    return dict(zip(configs, zip(configs.values(), report["results"], strict=True), strict=True))


def test_launch_module_exists(sglang_interpreter: Path) -> None:
    # Where the package is, without importing it (its __init__ is slow and pulls torchvision).
    code = "import importlib.util; print(importlib.util.find_spec('sglang').origin)"
    done = subprocess.run(
        [str(sglang_interpreter), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    package = Path(done.stdout.strip()).parent
    assert (package / "launch_server.py").is_file(), f"no sglang.launch_server in {package}"


@pytest.mark.parametrize("case", PARSE_CASES)
def test_sglang_parses_what_kvscope_asked(
    parsed: dict[str, tuple[EngineConfig, dict]], case: str
) -> None:
    cfg, result = parsed[case]
    fields = result["fields"]
    asked = {
        "model_path": cfg.model,
        "host": cfg.host,
        "port": cfg.port,
        "context_length": cfg.context_length,
        "served_model_name": cfg.served_model_name,
        "max_total_tokens": cfg.kv_capacity_tokens,
        "page_size": cfg.page_size,
        "radix_eviction_policy": cfg.eviction_policy,
        "disable_radix_cache": not cfg.prefix_cache,
        "enable_hierarchical_cache": cfg.hierarchical_cache,
        # telemetry kvscope always turns on
        "enable_cache_report": True,
        "enable_metrics": True,
        "enable_request_time_stats_logging": True,
        "export_metrics_to_file": True,
        "log_requests": True,
        "log_requests_level": cfg.request_log_level,
        "log_requests_format": "json",
    }
    assert {k: fields[k] for k in asked} == asked
    assert "agent" in fields["tokenizer_metrics_allowed_custom_labels"]
    tuning = fields["radix_eviction_policy_config"]
    if isinstance(tuning, str):
        tuning = json.loads(tuning)
    assert tuning == cfg.eviction_policy_config


@pytest.mark.parametrize("case", PARSE_CASES)
def test_engine_files_go_under_output_dir(
    parsed: dict[str, tuple[EngineConfig, dict]], case: str
) -> None:
    cfg, result = parsed[case]
    assert cfg.output_dir is not None
    metrics_dir = Path(result["fields"]["export_metrics_to_file_dir"])
    (log_dir,) = map(Path, result["fields"]["log_requests_target"])
    assert metrics_dir.is_relative_to(cfg.output_dir)
    assert log_dir.is_relative_to(cfg.output_dir)
    assert metrics_dir != log_dir


@pytest.mark.parametrize("case", PARSE_CASES)
def test_kv_events_config_as_sglang_reads_it(
    parsed: dict[str, tuple[EngineConfig, dict]], case: str
) -> None:
    cfg, result = parsed[case]
    flags = launch_flags(cfg)
    raw = result["fields"]["kv_events_config"]
    if not cfg.kv_events:
        assert "--kv-events-config" not in flags
        assert raw is None  # SGLang's default: the null publisher
        return
    asked = json.loads(flags[flags.index("--kv-events-config") + 1])
    assert json.loads(raw) == asked
    # KVEventsConfig ignores unknown keys: a misspelled one would be dropped silently.
    assert set(asked) <= set(result["kv_events_fields"])
    events, ep = result["kv_events"], SglangEngine(cfg).endpoints()
    assert events["publisher"] == "zmq"
    assert events["endpoint"] == ep.kv_events
    assert events["replay_endpoint"] == ep.kv_events_replay
    assert events["bind"] is not ep.kv_events_subscriber_binds  # exactly one side binds


def test_misspelled_flag_is_refused(sglang_interpreter: Path, model_dir: Path) -> None:
    flags = [*launch_flags(engine_config(model_dir)), "--enable-cache-reprot"]
    done = run_probe(sglang_interpreter, [flags])
    assert done.returncode == 2, done.stderr[-2000:]
    assert "unrecognized arguments: --enable-cache-reprot" in done.stderr


# Resolution is what `sglang.launch_server` runs next (before any GPU work): it checks how the
# flags combine. Every config kvscope accepts should pass, or kvscope should refuse it up front.
RESOLVE_CASES = [
    pytest.param(dict(eviction_policy=policy), id=f"policy-{policy}")
    for policy in ("lru", "lfu", "slru", "priority")
] + [
    pytest.param(
        dict(
            eviction_policy="tlru",
            eviction_policy_config={"threshold": 4096, "next_prompt_estimate": 512},
        ),
        id="policy-tlru",
    ),
    pytest.param(
        dict(eviction_policy="slru", eviction_policy_config={"protected_threshold": 4}),
        id="policy-slru-config",
    ),
    pytest.param(dict(prefix_cache=False), id="no-prefix-cache"),
    pytest.param(dict(hierarchical_cache=True), id="hicache"),
    pytest.param(
        dict(hierarchical_cache=True, prefix_cache=False),
        id="hicache-without-prefix-cache",  # kvscope refuses it, as SGLang would at startup
    ),
]
RESOLVE_BASE: dict[str, Any] = dict(
    kv_capacity_tokens=4096, page_size=16, extra_args=("--device", "cpu")
)


def accepted_config(model_dir: Path, options: dict[str, Any]) -> EngineConfig | None:
    """The config, or None where kvscope itself refuses it (a fine outcome too)."""
    try:
        cfg = engine_config(model_dir, **RESOLVE_BASE, **options)
        SglangEngine(cfg).launch()
    except (ValidationError, KvscopeError):
        return None
    return cfg


@pytest.fixture(scope="module")
def resolved(sglang_interpreter: Path, model_dir: Path) -> dict[str, str | None]:
    """resolve_once()'s error (or None) per accepted RESOLVE_CASES config, in one subprocess."""
    configs = {}
    for param in RESOLVE_CASES:
        cfg = accepted_config(model_dir, param.values[0])
        if cfg is not None:
            configs[json.dumps(param.values[0], sort_keys=True)] = cfg
    report = probe(sglang_interpreter, [launch_flags(c) for c in configs.values()], resolve=True)
    if report["resolve_unavailable"]:
        pytest.skip(f"cannot resolve ServerArgs: {report['resolve_unavailable']}")
    errors = [r["resolve_error"] for r in report["results"]]
    return dict(zip(configs, errors, strict=True))


@pytest.mark.parametrize("options", RESOLVE_CASES)
def test_sglang_accepts_the_combination(
    resolved: dict[str, str | None], options: dict[str, Any]
) -> None:
    key = json.dumps(options, sort_keys=True)
    if key not in resolved:
        return  # kvscope refuses this config before launching: nothing reaches SGLang
    assert resolved[key] is None
