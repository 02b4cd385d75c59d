"""RMSNorm in the two flavours our model families use: ``w * x`` (Llama) and ``(1 + w) * x`` (Gemma)."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from jido.layers.parameter import copy_weight, empty_parameter
from jido.utils.cpp_build import load_ops_library

SOURCE = Path(__file__).parent / "csrc" / "rms_norm.cpp"


@functools.cache
def load_norm_ops(source: Path = SOURCE) -> object | None:
    """``torch.ops.jido_norm`` (``rms_norm``) built from ``source``, or None (with a warning)."""
    if not load_ops_library("jido_norm", source, "C++ RMSNorm kernel", "F.rms_norm"):
        return None
    return torch.ops.jido_norm


# An eager op on fewer rows than this stays on PyTorch's ops (see triton_ops_for).
TRITON_MIN_ROWS = 256
_graph_depth = 0  # how many for_cuda_graphs blocks are open


@contextlib.contextmanager
def for_cuda_graphs() -> Iterator[None]:
    """Within this block every op on CUDA takes the Triton kernels, at any number of rows: a graph captured here
    replays them without launching, one kernel per op. The eager run before a capture belongs inside too, so that
    the kernels are compiled before capturing starts."""
    global _graph_depth
    _graph_depth += 1
    try:
        yield
    finally:
        _graph_depth -= 1


def triton_ops_for(x: torch.Tensor) -> ModuleType | None:
    """The Triton kernels (:func:`load_triton_ops`) for an op on ``x`` where they pay: on CUDA, for a CUDA graph
    (:func:`for_cuda_graphs`; each kernel fewer is time saved on every replay) or on :data:`TRITON_MIN_ROWS` rows
    or more (the GPU's time dominates). An eager step of fewer rows is bound by launching, where Triton's launcher
    costs several of PyTorch's: eager batch-1 decode of a Gemma 3 270M-shaped model ran slower on the kernels than
    on PyTorch's ops (benchmarks/results/gpu_session-2026-12-04-h200-second.md); None there and off CUDA."""
    if not x.is_cuda or (x.shape[0] < TRITON_MIN_ROWS and not _graph_depth):
        return None
    return load_triton_ops()


@functools.cache
def load_triton_ops() -> ModuleType | None:
    """:mod:`jido.layers.triton_ops` (the layer ops' GPU kernels, same calls as the C++ ones) where triton is
    installed, else None: then PyTorch's ops run on the GPU."""
    if importlib.util.find_spec("triton") is None:
        return None
    from jido.layers import triton_ops  # triton is imported only where a GPU tensor asks for it

    return triton_ops


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, float32 inside, one rounding to the dtype.

    ``unit_offset=True`` gives Gemma's ``x * (1 + w)``: the checkpoint's ``w`` is loaded as ``1 + w``
    (added in float32), so both flavours run the same kernel. In float32 this is exactly HF's arithmetic;
    in bf16 the stored ``1 + w`` and the product are rounded once more than HF's order (measured with the
    rest of bf16's error by ``benchmarks/bf16_accuracy.py``). On CPU one C++ kernel per call
    (``csrc/rms_norm.cpp``): ``F.rms_norm`` runs there as ~10 ATen ops, each with its dispatch cost, and Gemma 3
    270M runs 109 norms per step. On CUDA one Triton kernel (:mod:`jido.layers.triton_ops`), same arithmetic, where
    it pays (:func:`triton_ops_for`).
    ``forward(x, residual)`` returns ``residual + norm(x)`` (Gemma's norms after
    attention and MLP) from the same pass, rounded as the two ops would round.
    """

    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = empty_parameter(dim, weight_loader=self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        copy_weight(param.data, loaded.float() + 1.0 if self.unit_offset else loaded)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        ops = load_norm_ops() if x.is_cpu else triton_ops_for(x)
        if ops is not None:  # it makes x and residual contiguous (in C++: 109 norms a step, each call counts)
            return ops.rms_norm(x, self.weight, self.eps, residual)
        out = F.rms_norm(x, (self.dim,), self.weight, self.eps)
        return out if residual is None else residual + out
