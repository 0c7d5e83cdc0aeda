"""The SGLang adapter against SGLang 0.5.23's recorded outputs (no SGLang, no GPU needed).

The fixtures (tests/fixtures/sglang-0.5.23) were produced by SGLang's own code;
their README says how. SGLang's real parser runs on kvscope's flags in tests/sglang_conformance
(opt-in).
"""

import base64
import ipaddress
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args
from urllib.parse import urlsplit

import pytest
from helpers import SGLANG_FIXTURES

from kvscope.config import EngineConfig, EvictionPolicy
from kvscope.engines.detect import parse_metrics, reports_cached_tokens
from kvscope.engines.kv_events import decode, signed64
from kvscope.engines.sglang import CPU_DEFAULT_CAPACITY, SglangEngine
from kvscope.engines.vllm import VllmEngine
from kvscope.errors import ConfigError, EngineNotInstalled

METRICS_FILES = [
    "metrics_tokenizer_and_scheduler.prom",
    "metrics_tokenizer_and_scheduler.later.prom",
]
KV_EVENT_FILES = ["kv_events", "kv_events_radixcache"]
# The recorded run's flags, per the fixtures' README: --max-total-tokens 4096 --page-size 16.
RUN_CAPACITY, RUN_PAGE_SIZE = 4096, 16


@pytest.fixture(scope="module")
def fixtures() -> Path:
    return SGLANG_FIXTURES


# --- launch flags against SGLang's own --help --------------------------------------------------


@dataclass(frozen=True)
class HelpOption:
    takes_value: bool
    choices: frozenset[str] | None  # from a `{a,b,c}` metavar


# An option line of argparse's help: two spaces, the invocations, then 2+ spaces and the text.
_OPTION_LINE = re.compile(r"^  (-\S.*?)(?:\s{2,}|$)", re.MULTILINE)


def parse_help(text: str) -> dict[str, HelpOption]:
    """`--flag METAVAR, --alias METAVAR` lines of argparse --help -> {flag: HelpOption}."""
    options: dict[str, HelpOption] = {}
    for line in _OPTION_LINE.findall(text):
        for invocation in line.split(", "):
            flag, _, metavar = invocation.partition(" ")
            choices = None
            if metavar.startswith("{"):
                choices = frozenset(metavar[1 : metavar.index("}")].split(","))
            options[flag] = HelpOption(takes_value=bool(metavar), choices=choices)
    return options


def flag_problems(flags: list[str], options: dict[str, HelpOption]) -> list[str]:
    """Walk argv as argparse would: unknown flags, missing values, values outside choices."""
    problems: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        option = options.get(flag)
        i += 1
        if option is None:
            problems.append(f"{flag!r} is not an option of SGLang 0.5.23")
            continue
        if not option.takes_value:
            continue
        if i == len(flags) or flags[i].startswith("--"):
            problems.append(f"{flag} needs a value")
            continue
        if option.choices is not None and flags[i] not in option.choices:
            problems.append(f"{flag} {flags[i]!r} is not one of {sorted(option.choices)}")
        i += 1
    return problems


@pytest.fixture(scope="module")
def help_options(fixtures: Path) -> dict[str, HelpOption]:
    return parse_help((fixtures / "server_args_help.txt").read_text())


def full_config(tmp_path: Path, **overrides: Any) -> EngineConfig:
    """Every option that adds a flag turned on."""
    options: dict[str, Any] = dict(
        kind="sglang",
        model=str(tmp_path / "model"),
        served_model_name="tiny-chat",
        kv_capacity_tokens=4096,
        page_size=16,
        hierarchical_cache=True,
        eviction_policy="tlru",
        eviction_policy_config={"threshold": 4096, "next_prompt_estimate": 512},
        request_log_level=2,
        kv_events=True,
        kv_events_port=5611,
        output_dir=tmp_path / "out",
    )
    return EngineConfig(**{**options, **overrides})


def launch_flags(cfg: EngineConfig) -> list[str]:
    launch = SglangEngine(cfg).launch()
    assert launch is not None
    assert launch.argv[1:3] == ("-m", "sglang.launch_server")
    return list(launch.argv[3:])


def test_help_parser_reads_sglang_help(help_options: dict[str, HelpOption]) -> None:
    assert len(help_options) > 400
    assert help_options["--model"] == help_options["--model-path"]
    assert help_options["--enable-metrics"] == HelpOption(takes_value=False, choices=None)
    assert help_options["--log-requests-level"].choices == {"0", "1", "2", "3"}
    assert help_options["--page-size"] == HelpOption(takes_value=True, choices=None)


def test_flag_check_catches_mistakes(help_options: dict[str, HelpOption]) -> None:
    assert flag_problems(["--enable-cache-reprot"], help_options)
    assert flag_problems(["--page-size", "--enable-metrics"], help_options)
    assert flag_problems(["--log-requests-format", "yaml"], help_options)


# HiCache needs the radix cache, so "radix off" is its own variant.
@pytest.mark.parametrize("radix_off", [False, True])
def test_every_flag_is_an_sglang_option(
    tmp_path: Path, help_options: dict[str, HelpOption], radix_off: bool
) -> None:
    variant = dict(prefix_cache=False, hierarchical_cache=False) if radix_off else {}
    flags = launch_flags(full_config(tmp_path, **variant))
    assert ("--disable-radix-cache" in flags) is radix_off
    assert flag_problems(flags, help_options) == []


@pytest.mark.parametrize("policy", get_args(EvictionPolicy))
def test_every_eviction_policy_is_an_sglang_choice(
    tmp_path: Path, help_options: dict[str, HelpOption], policy: str
) -> None:
    tuning = {} if policy == "tlru" else {"eviction_policy_config": None}
    flags = launch_flags(full_config(tmp_path, eviction_policy=policy, **tuning))
    assert flag_problems(flags, help_options) == []


@pytest.mark.parametrize("level", range(4))
def test_every_request_log_level_is_an_sglang_choice(
    tmp_path: Path, help_options: dict[str, HelpOption], level: int
) -> None:
    flags = launch_flags(full_config(tmp_path, request_log_level=level))
    assert flag_problems(flags, help_options) == []


def test_kv_events_config_is_a_loopback_zmq_publisher(tmp_path: Path) -> None:
    cfg = full_config(tmp_path)
    flags = launch_flags(cfg)
    events = json.loads(flags[flags.index("--kv-events-config") + 1])
    endpoint = urlsplit(events["endpoint"])
    assert events["publisher"] == "zmq"
    assert endpoint.scheme == "tcp"
    assert ipaddress.ip_address(endpoint.hostname or "").is_loopback
    assert endpoint.port == cfg.kv_events_port
    assert events["endpoint"] == SglangEngine(cfg).endpoints().kv_events


def test_no_kv_events_config_when_off(tmp_path: Path) -> None:
    cfg = full_config(tmp_path, kv_events=False)
    assert "--kv-events-config" not in launch_flags(cfg)
    assert SglangEngine(cfg).endpoints().kv_events is None


# --- recorded /metrics, responses and KV events -------------------------------------------------


@pytest.mark.parametrize("name", METRICS_FILES)
def test_runtime_facts_from_metrics(fixtures: Path, name: str) -> None:
    families = parse_metrics((fixtures / name).read_text())
    facts = SglangEngine.runtime_facts(families)
    assert facts["capacity_tokens"] == RUN_CAPACITY
    assert facts["block_size"] == RUN_PAGE_SIZE
    assert SglangEngine.capacity_tokens(families) == RUN_CAPACITY


@pytest.mark.parametrize("name", METRICS_FILES)
def test_metrics_are_recognised_as_sglang(fixtures: Path, name: str) -> None:
    families = parse_metrics((fixtures / name).read_text())
    assert SglangEngine.owns_metrics(families)
    assert not VllmEngine.owns_metrics(families)


def sse_chunks(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of a `data: {...}` event stream, without the `[DONE]` marker."""
    chunks = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            chunks.append(json.loads(line[5:]))
    return chunks


def test_cached_tokens_reported_in_chat_response(fixtures: Path) -> None:
    usage = json.loads((fixtures / "chat_completion.json").read_text())["usage"]
    assert reports_cached_tokens(usage)


def test_cached_tokens_reported_in_stream_usage_chunk(fixtures: Path) -> None:
    chunks = sse_chunks((fixtures / "chat_completion_stream.sse").read_text())
    (usage_chunk,) = [c for c in chunks if c.get("usage")]
    assert usage_chunk["choices"] == []
    assert reports_cached_tokens(usage_chunk["usage"])


def test_null_prompt_tokens_details_is_not_a_report() -> None:
    # SGLang without --enable-cache-report: unknown, not zero.
    usage = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
    assert not reports_cached_tokens({**usage, "prompt_tokens_details": None})
    assert not reports_cached_tokens(None)


def read_frames(path: Path) -> list[list[bytes]]:
    """[topic, 8-byte big-endian seq, msgpack payload] per recorded ZMQ message."""
    frames = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        seq = rec["seq"].to_bytes(8, "big", signed=True)
        frames.append([bytes.fromhex(rec["topic_hex"]), seq, base64.b64decode(rec["payload_b64"])])
    return frames


@pytest.mark.parametrize("name", KV_EVENT_FILES)
def test_kv_event_frames_decode(fixtures: Path, name: str) -> None:
    frames = read_frames(fixtures / f"{name}.frames.jsonl")
    expected = json.loads((fixtures / f"{name}.decoded.json").read_text())
    assert len(frames) == len(expected)
    types: Counter[str] = Counter()
    for message, want in zip(frames, expected, strict=True):
        batch = decode(message)
        assert batch.seq == want["seq"]
        assert batch.ts_ns == round(want["payload"]["ts"] * 1e9)
        assert len(batch.events) == len(want["payload"]["events"])
        for got, raw in zip(batch.events, want["payload"]["events"], strict=True):
            assert got.kind == {"BlockStored": "stored", "BlockRemoved": "removed"}.get(
                raw["type"], "cleared"
            )
            assert list(got.block_hashes) == [signed64(h) for h in raw.get("block_hashes", [])]
            assert list(got.token_ids) == raw.get("token_ids", [])
            assert got.session_id == raw.get("session_id")
        types.update(e["type"] for e in want["payload"]["events"])
    # Counts from the fixtures' README.
    assert types == {"AllBlocksCleared": 2, "BlockStored": 50, "BlockRemoved": 11}


# --- attach and preflight -----------------------------------------------------------------------


def test_attach_by_url_launches_nothing() -> None:
    cfg = EngineConfig(
        kind="sglang", url="http://gpu-box:30000/", kv_events_endpoint="tcp://gpu-box:5557"
    )
    engine = SglangEngine(cfg)
    assert engine.launch() is None
    ep = engine.endpoints()
    assert ep.base_url == "http://gpu-box:30000"
    assert ep.metrics_url == "http://gpu-box:30000/metrics"
    assert ep.kv_events == "tcp://gpu-box:5557"
    engine.preflight()  # nothing local to check


def test_attach_uses_given_metrics_url_and_no_guessed_kv_events() -> None:
    cfg = EngineConfig(
        kind="sglang", url="http://gpu-box:30000", metrics_url="http://gpu-box:9000/metrics"
    )
    ep = SglangEngine(cfg).endpoints()
    assert ep.metrics_url == "http://gpu-box:9000/metrics"
    assert ep.kv_events is None


def sglang_importable() -> bool:
    """Checked in a fresh process, away from this one's sys.path (which holds tests/)."""
    done = subprocess.run([sys.executable, "-c", "import sglang.srt"], capture_output=True)
    return done.returncode == 0


def test_preflight_without_sglang(tmp_path: Path) -> None:
    if sglang_importable():
        pytest.skip("SGLang is importable by the test interpreter")
    # the test interpreter as `python:` (kvscope's own venv, no SGLang in it)
    cfg = EngineConfig(kind="sglang", model=str(tmp_path), python=sys.executable)
    with pytest.raises(EngineNotInstalled, match="not importable"):
        SglangEngine(cfg).preflight()


def test_preflight_names_the_install_command_where_sglang_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path / "cache"))  # no SGLang venv there
    cfg = EngineConfig(kind="sglang", model=str(tmp_path))
    with pytest.raises(EngineNotInstalled, match="kvscope engine install --engine sglang"):
        SglangEngine(cfg).preflight()


@pytest.mark.parametrize(("cores", "threads"), [(2, "1"), (16, None)])
def test_without_a_gpu_sglang_launches_its_cpu_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cores: int, threads: str | None
) -> None:
    monkeypatch.setattr("kvscope.engines.sglang.gpu_present", lambda: False)
    monkeypatch.setattr("kvscope.engines.sglang.os.cpu_count", lambda: cores)
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    engine = SglangEngine(EngineConfig(kind="sglang", model="/models/x"))
    launch = engine.launch()
    assert launch is not None
    argv, env = list(launch.argv), dict(launch.env)
    assert argv[0] == str(tmp_path / "engines" / "sglang-0.5.23-cpu" / "bin" / "python")
    for flag, value in [("--device", "cpu"), ("--attention-backend", "torch_native"),
                        ("--max-total-tokens", str(CPU_DEFAULT_CAPACITY))]:  # fmt: skip
        assert argv[argv.index(flag) + 1] == value
    assert "--sleep-on-idle" in argv and env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] == env["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] == "0"
    assert env.get("OMP_NUM_THREADS") == threads
    sized = SglangEngine(EngineConfig(kind="sglang", model="/m", kv_capacity_tokens=4096))
    sized_argv = list(sized.launch().argv)  # type: ignore[union-attr]
    assert sized_argv[sized_argv.index("--max-total-tokens") + 1] == "4096"


def test_with_a_gpu_sglang_launches_the_ordinary_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvscope.engines.sglang.gpu_present", lambda: True)
    launch = SglangEngine(EngineConfig(kind="sglang", model="/models/x")).launch()
    assert launch is not None
    assert "--device" not in launch.argv and "--max-total-tokens" not in launch.argv
    assert "SGLANG_USE_CPU_ENGINE" not in dict(launch.env)
    assert "sglang-0.5.23-cuda" in launch.argv[0]


def test_hicache_is_refused_on_the_cpu_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kvscope.engines.sglang.gpu_present", lambda: False)
    cfg = EngineConfig(kind="sglang", model="/models/x", hierarchical_cache=True)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        SglangEngine(cfg).preflight()
