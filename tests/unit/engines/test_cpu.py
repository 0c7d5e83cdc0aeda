"""The CPU engine's dtype: bfloat16 only where the CPU computes it natively."""

from pathlib import Path

import pytest

from kvscope.config import EngineConfig
from kvscope.engines import cpu
from kvscope.engines.cpu import CpuFacts, choose_dtype, read_cpu
from kvscope.engines.sglang import SglangEngine
from kvscope.engines.vllm import VllmEngine

AVX2_EPYC = "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 sha_ni vaes"
SAPPHIRE = "sse2 avx avx2 avx512f avx512dq avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8"
SKYLAKE = "sse2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl"


def cpuinfo(tmp_path: Path, flags: str, model: str = "Some CPU") -> Path:
    text = ""
    for n in range(2):  # one block per logical core, as /proc/cpuinfo has them
        text += f"processor\t: {n}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def no_caps_from_the_test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in cpu.ISA_CAP_VARS:
        monkeypatch.delenv(var, raising=False)


def test_reads_model_and_the_deciding_flags(tmp_path: Path) -> None:
    facts = read_cpu(cpuinfo(tmp_path, SAPPHIRE, "Intel Xeon"))
    assert facts.model == "Intel Xeon"
    assert facts.flags == ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    assert facts.native_bf16
    assert not read_cpu(cpuinfo(tmp_path, AVX2_EPYC)).native_bf16


@pytest.mark.parametrize(
    ("flags", "dtype"), [(AVX2_EPYC, "float32"), (SKYLAKE, "float32"), (SAPPHIRE, "bfloat16")]
)
def test_auto_is_bf16_only_with_native_bf16(tmp_path: Path, flags: str, dtype: str) -> None:
    choice = choose_dtype("auto", read_cpu(cpuinfo(tmp_path, flags)))
    assert choice.dtype == dtype
    assert choice.reason.startswith("auto: ")
    assert choice.as_dict()["isa_flags"] == [f for f in cpu.ISA_FLAGS if f in flags.split()]


@pytest.mark.parametrize(
    ("var", "value", "native"),
    [
        ("ONEDNN_MAX_CPU_ISA", "AVX2", False),
        ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE", False),
        ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", True),
        ("ONEDNN_MAX_CPU_ISA", "ALL", True),
        ("ATEN_CPU_CAPABILITY", "avx2", False),
        ("ATEN_CPU_CAPABILITY", "avx512", True),
    ],
)
def test_an_isa_cap_in_the_engine_env_turns_native_bf16_off(
    tmp_path: Path, var: str, value: str, native: bool
) -> None:
    facts = read_cpu(cpuinfo(tmp_path, SAPPHIRE), engine_env={var: value})
    assert facts.native_bf16 is native
    choice = choose_dtype("auto", facts)
    assert choice.dtype == ("bfloat16" if native else "float32")
    if not native:
        assert f"{var}={value}" in choice.reason


def test_a_cap_in_kvscopes_own_environment_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not read_cpu(cpuinfo(tmp_path, SAPPHIRE)).native_bf16
    # the engine's own env wins over kvscope's
    assert read_cpu(cpuinfo(tmp_path, SAPPHIRE), {"ONEDNN_MAX_CPU_ISA": "ALL"}).native_bf16


def test_an_explicit_dtype_is_kept_and_emulation_is_said(tmp_path: Path) -> None:
    avx2 = read_cpu(cpuinfo(tmp_path, AVX2_EPYC))
    forced = choose_dtype("bfloat16", avx2)
    assert forced.dtype == "bfloat16"
    assert "emulated" in forced.reason
    assert "emulated" not in choose_dtype("bfloat16", read_cpu(cpuinfo(tmp_path, SAPPHIRE))).reason
    assert choose_dtype("float32", avx2).dtype == "float32"


def test_unreadable_cpuinfo_means_no_native_bf16(tmp_path: Path) -> None:
    facts = read_cpu(tmp_path / "missing")
    assert facts.flags == () and facts.model is None
    assert choose_dtype("auto", facts).dtype == "float32"


def _launch_dtype(engine: VllmEngine | SglangEngine) -> str | None:
    argv = engine.launch().argv  # type: ignore[union-attr]
    return argv[argv.index("--dtype") + 1] if "--dtype" in argv else None


@pytest.mark.parametrize(("flags", "dtype"), [(AVX2_EPYC, "float32"), (SAPPHIRE, "bfloat16")])
def test_vllm_cpu_launches_with_the_chosen_dtype(
    monkeypatch: pytest.MonkeyPatch, flags: str, dtype: str
) -> None:
    facts = CpuFacts("cpu", 2, tuple(f for f in cpu.ISA_FLAGS if f in flags.split()))
    monkeypatch.setattr("kvscope.engines.vllm.read_cpu", lambda engine_env=None: facts)
    engine = VllmEngine(EngineConfig())
    assert _launch_dtype(engine) == dtype
    assert engine.model_facts()["weights_dtype"] == dtype
    forced = VllmEngine(EngineConfig(dtype="bfloat16"))
    assert _launch_dtype(forced) == "bfloat16"


def test_sglang_on_a_gpu_passes_dtype_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvscope.engines.sglang.gpu_present", lambda: True)
    cfg = {"kind": "sglang", "model": "/models/x"}
    assert _launch_dtype(SglangEngine(EngineConfig(**cfg))) is None
    assert _launch_dtype(SglangEngine(EngineConfig(**cfg, dtype="bfloat16"))) == "bfloat16"
    assert SglangEngine(EngineConfig(**cfg)).dtype_choice().dtype == "auto"


@pytest.mark.parametrize(("flags", "dtype"), [(AVX2_EPYC, "float32"), (SAPPHIRE, "bfloat16")])
def test_sglang_on_the_cpu_launches_with_the_chosen_dtype(
    monkeypatch: pytest.MonkeyPatch, flags: str, dtype: str
) -> None:
    facts = CpuFacts("cpu", 2, tuple(f for f in cpu.ISA_FLAGS if f in flags.split()))
    monkeypatch.setattr("kvscope.engines.sglang.gpu_present", lambda: False)
    monkeypatch.setattr("kvscope.engines.sglang.read_cpu", lambda engine_env=None: facts)
    cfg = {"kind": "sglang", "model": "/models/x"}
    assert _launch_dtype(SglangEngine(EngineConfig(**cfg))) == dtype
    assert _launch_dtype(SglangEngine(EngineConfig(**cfg, dtype="float32"))) == "float32"


@pytest.mark.parametrize(("cores", "reserved"), [(1, "0"), (2, "0"), (4, None), (None, None)])
def test_small_machines_reserve_no_core_and_wait_passively(
    monkeypatch: pytest.MonkeyPatch, cores: int | None, reserved: str | None
) -> None:
    monkeypatch.setattr("kvscope.engines.vllm.os.cpu_count", lambda: cores)
    env = dict(VllmEngine(EngineConfig()).launch().env)
    assert env.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == reserved
    assert env.get("OMP_WAIT_POLICY") == (None if reserved is None else "PASSIVE")
    # the config's own env wins, and a vLLM of the user's own gets none of it
    mine = VllmEngine(EngineConfig(env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})).launch()
    assert dict(mine.env)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    theirs = VllmEngine(EngineConfig(python="/opt/vllm/bin/python")).launch()
    assert "OMP_WAIT_POLICY" not in dict(theirs.env)
