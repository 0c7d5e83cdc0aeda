"""What the host CPU offers a CPU engine, and the dtype chosen from it.

A CPU without native bfloat16 (no AVX512-BF16, no AMX-BF16) emulates it: on a 2-core AVX2 EPYC
vLLM CPU prefilled 572 tokens in 28.4 s in bfloat16 and 8.7 s in float32 (shared/notes/
cpu-engines.md). So `dtype: auto` is bfloat16 only where the CPU has it natively, float32
otherwise. oneDNN's and ATen's ISA caps (`ONEDNN_MAX_CPU_ISA`, `ATEN_CPU_CAPABILITY`), in
kvscope's environment or the engine's, count: a capped AVX-512 machine behaves as an AVX2 one.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Dtype = Literal["auto", "float32", "bfloat16"]
# The flags (as /proc/cpuinfo spells them) that decide the dtype and the kernels.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ISA_CAP_VARS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
# Cap values below native bf16: oneDNN's ISAs under avx512_core_bf16, ATen's under avx512.
_NO_BF16_CAPS = {
    "ONEDNN_MAX_CPU_ISA": frozenset(
        {"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni"}
    ),
    "ATEN_CPU_CAPABILITY": frozenset({"default", "avx2"}),
}


@dataclass(frozen=True)
class CpuFacts:
    """The host CPU as an engine sees it: its model, cores, ISA flags and the caps in force."""

    model: str | None
    logical_cores: int | None
    flags: tuple[str, ...]  # the ISA_FLAGS the CPU has
    isa_caps: tuple[tuple[str, str], ...] = ()  # (variable, value) in force for the engine

    @property
    def native_bf16(self) -> bool:
        if not any(f in self.flags for f in BF16_FLAGS):
            return False
        return not any(value.lower() in _NO_BF16_CAPS[var] for var, value in self.isa_caps)

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "logical_cores": self.logical_cores,
            "isa_flags": list(self.flags),
            "isa_caps": dict(self.isa_caps),
            "native_bf16": self.native_bf16,
        }


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype an engine runs with, what was asked for, and why."""

    requested: Dtype
    dtype: str
    reason: str
    cpu: CpuFacts | None = None  # the CPU facts that decided it (a CPU engine's auto)

    def as_dict(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "requested": self.requested,
            "dtype": self.dtype,
            "reason": self.reason,
        }
        if self.cpu is not None:
            doc["isa_flags"] = list(self.cpu.flags)
            doc["isa_caps"] = dict(self.cpu.isa_caps)
        return doc


def read_cpu(
    cpuinfo: Path = Path("/proc/cpuinfo"), engine_env: Mapping[str, str] | None = None
) -> CpuFacts:
    """This machine's CPU; the ISA caps from the engine's environment over kvscope's own."""
    model, flags = None, set()
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model is None:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    env = {**os.environ, **(engine_env or {})}
    caps = tuple((var, env[var]) for var in ISA_CAP_VARS if env.get(var))
    return CpuFacts(model, os.cpu_count(), tuple(f for f in ISA_FLAGS if f in flags), caps)


def choose_dtype(requested: Dtype, cpu: CpuFacts) -> DtypeChoice:
    """bfloat16 where the CPU computes it natively, float32 where it would be emulated."""
    if requested != "auto":
        slow = requested == "bfloat16" and not cpu.native_bf16
        note = " (emulated on this CPU: slow)" if slow else ""
        return DtypeChoice(requested, requested, f"engine.dtype: {requested}{note}", cpu)
    if cpu.native_bf16:
        have = ", ".join(f for f in BF16_FLAGS if f in cpu.flags)
        return DtypeChoice(requested, "bfloat16", f"auto: the CPU has native bf16 ({have})", cpu)
    if any(f in cpu.flags for f in BF16_FLAGS):
        caps = ", ".join(f"{k}={v}" for k, v in cpu.isa_caps)
        return DtypeChoice(requested, "float32", f"auto: native bf16 disabled by {caps}", cpu)
    reason = "auto: no native bf16 (avx512_bf16 / amx_bf16) on this CPU"
    return DtypeChoice(requested, "float32", reason, cpu)
