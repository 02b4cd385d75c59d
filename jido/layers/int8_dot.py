"""Linear layers by integer dot products: x quantized to int8 per block of 32 columns, times a QuantizedWeight's codes.

Decode reads every weight once per step, so its speed is the weight bytes over the memory's bandwidth, if the
arithmetic keeps up. Widening each int8 / int4 code to float for an FMA (``quant_kernels``' streaming kernel)
costs ~12 instructions per 32 weights and left the bandwidth half used; multiplying the codes by int8
activations takes 3-5 (AVX2 ``maddubs`` + ``madd``, or AVX-512 VNNI ``vpdpbusd``), as llama.cpp and vLLM's GGUF
kernels do. The price is rounding x: each block of 32 is scaled by ``max |x| / 127`` (llama.cpp's Q8_0
activations); the mins' term of asymmetric weights uses x's exact sums. The C++ kernels (``csrc/int8_dot.cpp``)
hold an AVX2 and an AVX-512 VNNI kernel; :func:`dot_isa` picks one by the CPU's flags.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from jido.layers.quant_kernels import QuantizedWeight, dequantize_reference
from jido.utils.cpp_build import load_ops_library
from jido.utils.cpu import CpuInfo, cpu_info

SOURCE = Path(__file__).parent / "csrc" / "int8_dot.cpp"
BLOCK = 32  # columns of x per scale
# The kernels' ISAs, in the order of the C++ `isa` argument.
ISAS = ("avx2", "avx512_vnni")
# Up to this many rows of x the layers multiply by their codes here; more rows go to the float kernels.
MAX_ROWS = 16


def dot_isa(cpu: CpuInfo) -> str | None:
    """The int8 dot-product kernel this CPU runs: ``avx512_vnni`` (vpdpbusd), ``avx2`` (maddubs), or None."""
    if {"avx512_vnni", "avx512vl"} <= cpu.flags:
        return "avx512_vnni"
    if {"avx2", "fma"} <= cpu.flags:
        return "avx2"
    return None


@functools.cache
def load_int8_dot_ops(source: Path = SOURCE) -> object | None:
    """``torch.ops.jido_int8_dot`` built from ``source`` when this CPU runs one of its kernels, else None."""
    isa = dot_isa(cpu_info())
    if isa is None or not load_ops_library("jido_int8_dot", source, "C++ int8 dot-product kernels",
                                           "the float kernels"):
        return None
    ops = torch.ops.jido_int8_dot
    return ops if ops.supported(ISAS.index(isa)) else None


def supports(w: QuantizedWeight) -> bool:
    """Whether the kernels take ``w``'s groups: 16 columns, a multiple of 32, or a whole row."""
    return w.group_size == 16 or w.group_size % BLOCK == 0 or w.group_size >= w.shape[1]


def runs(w: QuantizedWeight) -> bool:
    """The kernels are built for this CPU and take ``w``."""
    return supports(w) and load_int8_dot_ops() is not None


def int8_dot_linear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x w^T (+ bias)`` with x rounded to int8 per block (see the module docstring), in ``x.dtype``.

    Needs :func:`load_int8_dot_ops` to have built and :func:`supports` to accept ``w``.
    """
    ops = load_int8_dot_ops()
    return ops.linear(x, w.data, w.scales, w.mins, w.group_size, w.bits, w.shape[1], bias,
                      ISAS.index(dot_isa(cpu_info())))


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' rounding of x ``[M, K]``: int8 codes ``[M, K]`` and float32 block scales ``[M, ceil(K / 32)]``,
    ``x ~= codes * scales`` per block, bit for bit what the C++ kernels compute."""
    x = x.to(torch.float32)
    num_cols = x.shape[1]
    blocks = F.pad(x, (0, -num_cols % BLOCK)).reshape(x.shape[0], -1, BLOCK)  # [M, nb, 32]
    scales = blocks.abs().amax(dim=-1) / 127
    inverse = torch.where(scales != 0, 1 / scales, torch.zeros_like(scales))
    codes = torch.round(blocks * inverse[..., None]).to(torch.int8).flatten(1)[:, :num_cols]
    return codes, scales


def int8_dot_linear_reference(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What :func:`int8_dot_linear` computes, in float64: rounded x times the scaled codes, plus mins times x's
    exact group sums."""
    codes, scales = quantize_activations(x)
    num_cols = w.shape[1]
    x_rounded = codes.double() * scales.double().repeat_interleave(BLOCK, dim=1)[:, :num_cols]
    scaled_codes = dequantize_reference(QuantizedWeight(w.data, w.scales, None, w.group_size, w.bits, w.shape))
    out = x_rounded @ scaled_codes.double().T
    if w.mins is not None:
        mins = w.mins.double().repeat_interleave(w.group_size, dim=1)[:, :num_cols]
        out += x.double() @ mins.T
    return out if bias is None else out + bias.double()
