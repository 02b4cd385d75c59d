"""A Triton kernel for fp8_linear's activations on a GPU: each row rounded to e4m3 with its own scale, one launch.

The arithmetic of :func:`jido.layers.fp8_linear.quantize_rows_reference` (row maximum / 448, then each value over
the scale, saturated, rounded to nearest even) with IEEE divisions; PyTorch's CUDA ops take six launches for it,
and eager decode of a small model is bound by launches (on an H200 one fp8 call on a Gemma 3 270M layer spent most
of its time outside the matmul). Not bit-identical to PyTorch on a GPU, whose division by a tensor of
scales rounds differently in the last bit: on an H200, 0 to 101 of 50,688 codes (one step of e4m3 each) and some
scales' last bits differed (benchmarks/results/gpu_session-2026-12-04-h200.md). Not run under Triton's interpreter: its
fp8 conversion rounds differently from the GPU's (seen: 64 for a value PyTorch rounds to 128).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)
TINY = tl.constexpr(1.1754943508222875e-38)  # float32's smallest normal: a row of zeros keeps finite codes


@triton.jit
def _quantize_rows_kernel(x_ptr, codes_ptr, scale_ptr, cols, x_stride, codes_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * x_stride + offsets, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=0), FP8_MAX), TINY)
    codes = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX)
    tl.store(codes_ptr + row * codes_stride + offsets, codes.to(codes_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_rows_cuda(x: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[rows, cols]`` (CUDA, rows contiguous) as codes and a float32 scale per row ``[rows, 1]``."""
    rows, cols = x.shape
    codes = torch.empty(rows, cols, dtype=fp8_dtype, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(cols)
    _quantize_rows_kernel[(rows,)](x, codes, scale, cols, x.stride(0), codes.stride(0), BLOCK=block,
                                   num_warps=4 if block <= 2048 else 8)
    return codes, scale
