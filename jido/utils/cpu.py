"""What this CPU can do: its model, core count and the instruction-set features that pick kernels and precision.

Machines of one kind differ from day to day (AVX-512 BF16 on one, AVX2 + FMA only on the next, where a
bf16 matmul is hundreds of times slower than float32), so jido reads the features at start, logs them,
dispatches on them and records them with every measurement.
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

# The flags (as /proc/cpuinfo spells them) that change which kernels and precision are fast.
KEY_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
             "amx_bf16", "amx_int8", "amx_tile")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    num_cpus: int
    flags: frozenset[str]

    @property
    def key_flags(self) -> list[str]:
        """The flags of :data:`KEY_FLAGS` this CPU has, in that order."""
        return [f for f in KEY_FLAGS if f in self.flags]

    @property
    def has_native_bf16(self) -> bool:
        """bf16 matmuls run in hardware (AVX-512 BF16 or AMX); elsewhere oneDNN emulates them, far slower than fp32."""
        return "avx512_bf16" in self.flags or "amx_bf16" in self.flags

    @property
    def has_onednn_bf16(self) -> bool:
        """oneDNN can reorder and multiply bf16 weights (it refuses without AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
        return {"avx512bw", "avx512vl", "avx512dq"} <= self.flags or "avx_ne_convert" in self.flags

    @property
    def isa(self) -> str:
        """The widest vector ISA, the name kernels dispatch on: ``amx``, ``avx512``, ``avx2`` or ``scalar``."""
        if "amx_tile" in self.flags:
            return "amx"
        if "avx512f" in self.flags:
            return "avx512"
        if "avx2" in self.flags and "fma" in self.flags:
            return "avx2"
        return "scalar"

    def describe(self) -> str:
        """One line for logs and result files, e.g. ``AMD EPYC, 2 CPUs, avx512 (avx2 fma avx512f ...)``."""
        return f"{self.model}, {self.num_cpus} CPUs, {self.isa} ({' '.join(self.key_flags) or 'no vector flags'})"

    def as_dict(self) -> dict[str, object]:
        return {"cpu_model": self.model, "num_cpus": self.num_cpus, "isa": self.isa, "cpu_flags": self.key_flags,
                "native_bf16": self.has_native_bf16}


@functools.cache
def cpu_info() -> CpuInfo:
    """This machine's CPU, read once per process from ``/proc/cpuinfo`` (model and flags of the first core)."""
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model, flags = parse_cpuinfo(f.read())
    except OSError:
        pass
    return CpuInfo(model or platform.processor() or platform.machine() or "unknown", os.cpu_count() or 1, flags)


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """``(model name, flags)`` of the first processor listed in a ``/proc/cpuinfo`` text."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if model and flags:
            break
    return model, flags
