"""Loads the C++ CPU attention kernels (``csrc/paged_decode.cpp``: paged decode and the KV write), built and
cached by :mod:`jido.utils.cpp_build`.

A build that fails logs a warning and leaves the caller on its PyTorch decode path.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from jido.utils.cpp_build import load_ops_library

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"


@functools.cache
def load_paged_decode(source: Path = SOURCE) -> object | None:
    """``torch.ops.jido_cpu_attn.paged_decode`` built from ``source``, or None (with a warning) if it cannot be built."""
    if not load_ops_library("jido_cpu_attn", source, "C++ attention kernels", "the PyTorch decode path"):
        return None
    return torch.ops.jido_cpu_attn.paged_decode


def load_write_kv() -> object | None:
    """``torch.ops.jido_cpu_attn.write_kv`` (the same library as :func:`load_paged_decode`), or None."""
    return None if load_paged_decode() is None else torch.ops.jido_cpu_attn.write_kv


PREFILL_SOURCE = Path(__file__).parent / "csrc" / "flash_prefill.cpp"


@functools.cache
def load_flash_prefill(source: Path = PREFILL_SOURCE, on_amx: bool = False) -> object | None:
    """``torch.ops.jido_cpu_prefill.flash_prefill`` (bf16 causal prefill on oneDNN's AVX-512 BF16 micro-kernels), or
    None: where oneDNN runs AMX, unless ``on_amx`` (PyTorch's SDPA measured faster there), or where the library
    cannot be built (with a warning)."""
    if not load_ops_library("jido_cpu_prefill", source, "C++ prefill attention", "PyTorch's SDPA for prefill"):
        return None
    return None if torch.ops.jido_cpu_prefill.amx() and not on_amx else torch.ops.jido_cpu_prefill.flash_prefill
