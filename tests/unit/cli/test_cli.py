"""CLI behaviour that needs no engine: clear one-line errors, status and down without one."""

import socket
import sys
from pathlib import Path

import pytest
from helpers import free_port
from typer.testing import CliRunner

from kvscope.cli import app

runner = CliRunner()


def one_error_line(result: object) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    return lines[0]


def test_missing_engine(isolated_dirs: Path) -> None:
    line = one_error_line(runner.invoke(app, ["engine", "up"]))
    assert "not installed" in line and "kvscope engine install" in line


def test_bad_model_path(isolated_dirs: Path) -> None:
    cfg = isolated_dirs / "engine.yaml"
    cfg.write_text(f"engine:\n  python: {sys.executable}\n  model: /no/such/model\n")
    line = one_error_line(runner.invoke(app, ["engine", "up", str(cfg)]))
    assert "/no/such/model" in line


def test_occupied_port(isolated_dirs: Path) -> None:
    model = isolated_dirs / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = isolated_dirs / "engine.yaml"
    with socket.socket() as s:  # the port held from the start: nothing can take it meanwhile
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg.write_text(f"python: {sys.executable}\nmodel: {model}\nport: {port}\n")
        line = one_error_line(runner.invoke(app, ["engine", "up", str(cfg)]))
    assert f"port {port}" in line and "already in use" in line


def test_config_error_before_anything_starts(isolated_dirs: Path) -> None:
    cfg = isolated_dirs / "engine.yaml"
    cfg.write_text("engine:\n  kind: vllm\n  kv_capacity_tokens: -5\n")
    line = one_error_line(runner.invoke(app, ["engine", "up", str(cfg)]))
    assert "kv_capacity_tokens" in line


def test_attach_to_nothing(isolated_dirs: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = one_error_line(runner.invoke(app, ["engine", "up", "--url", url]))
    assert "cannot reach" in line


@pytest.mark.skipif(sys.platform != "linux", reason="no nvidia-smi expected")
def test_sglang_without_gpu_or_package(isolated_dirs: Path) -> None:
    line = one_error_line(runner.invoke(app, ["engine", "up", "-e", "sglang"]))
    assert "SGLang" in line


def test_status_and_down_without_an_engine(isolated_dirs: Path) -> None:
    status = runner.invoke(app, ["engine", "status"])
    assert status.exit_code == 1
    assert "no engine is up" in status.output
    down = runner.invoke(app, ["engine", "down"])
    assert down.exit_code == 0
    assert "no engine is up" in down.output


def test_command_prints_the_sglang_launch(isolated_dirs: Path) -> None:
    result = runner.invoke(
        app, ["engine", "command", "-e", "sglang", "--kv-capacity-tokens", "8192"]
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "sglang.launch_server" in text
    assert "--max-total-tokens 8192" in text
    assert "--enable-cache-report" in text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("workload:\n  concurrency: 0\n", "concurrency"),
        ("workload:\n  layout: sideways\n", "layout"),
        ("engine:\n  kind: vllm\n  eviction_policy: lfu\n", "LRU only"),
        (
            "engine:\n  context_length: 1024\nworkload:\n  mode: synthetic\n"
            "  synthetic: {fixed_tokens: 1000, dynamic_tokens: 32, output_tokens: 32}\n",
            "context_length",
        ),
    ],
)
def test_run_config_errors_come_before_any_engine(
    isolated_dirs: Path, text: str, fragment: str
) -> None:
    cfg = isolated_dirs / "experiment.yaml"
    cfg.write_text(text + f"runs_dir: {isolated_dirs / 'runs'}\n")
    line = one_error_line(runner.invoke(app, ["run", str(cfg)]))
    assert fragment in line
    # nothing was started: the engine is not even installed in these directories
    assert "not installed" not in line


def test_status_shows_the_dtype_and_the_capabilities(capsys: pytest.CaptureFixture[str]) -> None:
    """`engine up` / `status` of a launched engine: its dtype line does not hide the rest."""
    from kvscope.cli.engine import _show
    from kvscope.config import EngineConfig
    from kvscope.engines import make_engine
    from kvscope.engines.base import Capabilities, Endpoints
    from kvscope.engines.state import EngineState

    dtype = {"dtype": "float32", "reason": "no native bf16", "isa_flags": ["avx2"],
             "isa_caps": {"VLLM_CPU_ISA": "avx2"}}  # fmt: skip
    ep = Endpoints("http://127.0.0.1:1", None, None)
    st = EngineState("vllm", None, (), ep, None, None, dtype=dtype)
    caps = Capabilities("vllm", ("smollm2",), True, True, True, 4096)
    _show(make_engine(EngineConfig()), st, caps, healthy=True)
    out = capsys.readouterr().out
    assert "float32 (no native bf16; CPU flags: avx2, VLLM_CPU_ISA=avx2)" in out
    assert "smollm2" in out and "4,096 tokens" in out


def test_a_command_loads_only_its_own_module() -> None:
    """`kvscope replay` builds the app with replay alone (cli.build): run's, profile's and the
    engines' modules stay unloaded; `kvscope --help` lists every command."""
    import subprocess

    code = (
        "import sys; sys.argv = ['kvscope', 'replay', '--help']\n"
        "from kvscope.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "loaded = [m for m in ('kvscope.cli.run', 'kvscope.cli.profile', 'kvscope.cli.engine',"
        " 'matplotlib.pyplot') if m in sys.modules]\n"
        "print('LOADED', loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "--capacity-tokens" in out.stdout and "LOADED []" in out.stdout, out.stdout
    listed = runner.invoke(app, ["--help"]).output
    for name in ("engine", "run", "profile", "replay", "sweep", "report", "compare", "log"):
        assert f" {name} " in listed, name
