"""Loads the C++ CPU attention kernels (``csrc/paged_decode.cpp``: paged decode and the KV write;
``csrc/flash_prefill.cpp``: bf16 prefill, on AMX tiles or oneDNN's AVX-512 BF16 micro-kernels), built and cached
by :mod:`jido.utils.cpp_build`.

A build that fails, or a prefill kernel that fails its load-time self-check, logs a warning and leaves the caller
on its PyTorch path.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from jido.utils.cpp_build import load_ops_library

logger = logging.getLogger(__name__)

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
    ops = _prefill_ops(source)
    if ops is None or (ops.amx() and not on_amx):
        return None
    return _checked_prefill(ops.flash_prefill)


@functools.cache
def load_tile_prefill(source: Path = PREFILL_SOURCE) -> object | None:
    """``torch.ops.jido_cpu_prefill.tile_prefill`` (bf16 causal prefill on AMX tiles), or None where this process
    cannot multiply AMX-BF16 tiles or the library cannot be built (with a warning). Where it runs it beats PyTorch's
    SDPA on sliding and global layers (benchmarks/results/prefill_attention-2026-12-05-amx-xeon.md)."""
    ops = _prefill_ops(source)
    if ops is None or not ops.tiles():
        return None
    return _checked_prefill(ops.tile_prefill)


def _prefill_ops(source: Path) -> object | None:
    """``torch.ops.jido_cpu_prefill`` built from ``source``, or None (with a warning) if it cannot be built."""
    if not load_ops_library("jido_cpu_prefill", source, "C++ prefill attention", "PyTorch's SDPA for prefill"):
        return None
    return torch.ops.jido_cpu_prefill


def _checked_prefill(kernel: Callable) -> Callable | None:
    """``kernel`` if it passes :func:`_prefill_self_check`, else None with a warning."""
    try:
        error = _prefill_self_check(kernel)
    except RuntimeError as exc:  # oneDNN refused its micro-kernels here (its ISA held down, say)
        logger.warning("C++ prefill attention unavailable (%s); using PyTorch's SDPA for prefill",
                       str(exc).strip().splitlines()[0])
        return None
    if not error < 0.05:
        logger.warning("C++ prefill attention unavailable (its self-check was off by %.3g); using PyTorch's SDPA for "
                       "prefill", error)
        return None
    return kernel


def _prefill_self_check(kernel: Callable) -> float:
    """The kernel's largest error on a small causal prompt against float64 attention: a CPU whose oneDNN runs the
    micro-kernels differently than the ones it was checked on fails here, at load, not in a request."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen) for shape in ((40, 2, 64), (1, 40, 64), (1, 40, 64)))
    out = torch.empty(40, 2, 64, dtype=torch.bfloat16)
    kernel(out, q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125, 0, 0, 0, 0.0, 16)
    scores = torch.einsum("qhd,kd->hqk", q.bfloat16().double(), k[0].bfloat16().double()) * 0.125
    scores = scores.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.einsum("hqk,kd->qhd", scores.softmax(-1), v[0].bfloat16().double())
    return float((out.double() - expected).abs().max())
