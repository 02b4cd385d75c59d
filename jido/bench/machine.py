"""Where a figure was measured: date, CPU model, features and count, torch, bandwidth, OS and Python."""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

from jido.utils.cpu import cpu_info

# NOTE: written by `jido roofline` (jido/tools/roofline.py, `MachinePeaks`); read here without torch.
ROOFLINE_CACHE = Path.home() / ".cache" / "jido" / "roofline.json"


def machine_info(roofline_cache: Path = ROOFLINE_CACHE) -> dict[str, Any]:
    """The CPU (model, count, ISA, key flags, native bf16), the installed torch, and the copy bandwidth and
    oneDNN version `jido roofline` measured on this CPU (None when it has not)."""
    return {**cpu_info().as_dict(), "torch": _installed_version("torch"), **roofline_figures(roofline_cache),
            "platform": platform.platform(), "python": platform.python_version(), "hostname": platform.node()}


def roofline_figures(path: Path) -> dict[str, Any]:
    """Copy bandwidth and oneDNN version from `jido roofline`'s cache, when it was measured on this CPU."""
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cached = {}
    same_cpu = isinstance(cached, dict) and cached.get("cpu") == cpu_info().as_dict()
    bandwidth = cached.get("bandwidth_bytes_s") if same_cpu else None
    return {"memory_bandwidth_gb_s": None if bandwidth is None else round(bandwidth / 1e9, 1),
            "onednn": cached.get("onednn") if same_cpu else None}


def cpu_kind(machine: dict[str, Any] | None = None) -> str:
    """The CPU kind results files are named by (benchmarks/README.md): ``zen4`` (AMD with AVX-512 BF16),
    ``avx2-epyc`` (AMD with AVX2, no AVX-512), ``amx-xeon`` (Intel with AMX), ``xeon-vnni`` (Intel with AVX-512
    VNNI, no BF16 or AMX); any other CPU by its ISA. ``machine`` is a record as :func:`machine_info` writes it
    (``cpu_model``, ``cpu_flags``, ``isa``); None: this machine's."""
    machine = machine or cpu_info().as_dict()
    model, flags = str(machine.get("cpu_model", "")).lower(), set(machine.get("cpu_flags") or [])
    if "amd" in model:
        if "avx512_bf16" in flags:
            return "zen4"
        if "avx2" in flags and "avx512f" not in flags:
            return "avx2-epyc"
    if "intel" in model:
        if "amx_tile" in flags:
            return "amx-xeon"
        if "avx512_vnni" in flags and not flags & {"avx512_bf16", "amx_bf16"}:
            return "xeon-vnni"
    return str(machine.get("isa") or "cpu")


def describe_machine(machine: dict[str, Any]) -> str:
    """One line for reports: model, CPUs, ISA and flags, bf16, torch/oneDNN, bandwidth, OS."""
    flags = " ".join(machine.get("cpu_flags") or []) or "no vector flags"
    parts = [f"{machine.get('cpu_model', 'unknown CPU')}, {machine.get('num_cpus', '?')} CPUs",
             f"{machine.get('isa', '?')} ({flags})",
             "native bf16" if machine.get("native_bf16") else "no native bf16"]
    if machine.get("torch"):
        parts.append(f"torch {machine['torch']}" + (f", oneDNN {machine['onednn']}" if machine.get("onednn") else ""))
    if machine.get("memory_bandwidth_gb_s"):
        parts.append(f"{machine['memory_bandwidth_gb_s']:.1f} GB/s copy bandwidth")
    return "; ".join(p for p in [*parts, machine.get("platform")] if p)


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds")
