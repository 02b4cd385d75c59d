"""Triton kernels for a layer's small ops on a GPU: RMSNorm (with Gemma's residual add), the q/k norms and RoPE in
place, and the gated activation, each one launch where PyTorch's ops take several.

On a GPU a decode step of a small model is bound by kernel launches, and with CUDA graphs by the kernels' count
(a few microseconds each however little they do): a Gemma 3 270M-shaped step ran ~455 kernels, ~25 a layer, of
which the rotary embedding alone (split, four products, a difference, a sum and a concatenation, for q and k)
took ~14 (benchmarks/results/gpu_session-2026-12-04-h200.md). These are the GPU versions of the C++ CPU kernels
(``csrc/rms_norm.cpp``, ``csrc/activation.cpp``), with their arithmetic: float32 inside, values rounded to the
dtype where the unfused ops round them (the normed values, each product of the rotation, the activation before
the product), so in bf16 they match PyTorch's ops up to float32 rounding inside a value.

They run CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check them without
a GPU, in float32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SILU, GELU_TANH = 0, 1  # the activations act_and_mul fuses (csrc/activation.cpp's numbering)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


def _num_warps(block: int) -> int:
    return 4 if block <= 1024 else 8


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, res_ptr, out_ptr, x_stride, res_stride, out_stride, dim, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """One program a row: out = x / sqrt(mean(x^2) + eps) * w, rounded (then residual + it, rounded again)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < dim
    x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / dim + eps)
    out = (x * scale * w).to(out_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        residual = tl.load(res_ptr + row * res_stride + offs, mask=mask, other=0.0).to(tl.float32)
        out = (residual + out.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_stride + offs, out, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension (``residual + norm(x)`` when given), a new tensor like ``x``."""
    dim = x.shape[-1]
    rows = x if x.dim() == 2 and x.stride(-1) == 1 else x.reshape(-1, dim)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    res = out if residual is None else residual.reshape(-1, dim)
    if res.stride(-1) != 1:
        res = res.contiguous()
    block = triton.next_power_of_2(dim)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, res, out, rows.stride(0), res.stride(0), out.stride(0), dim,
                                          eps, HAS_RESIDUAL=residual is not None, BLOCK=block,
                                          num_warps=_num_warps(block))
    return out.view(x.shape)


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, qkv_stride, cos_stride, sin_stride,
                         num_q_heads, eps, HAS_NORM: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """One program per (token, q or k head), in place: the head normed (its own norm's weight) and rotated,
    rotate-half layout, each step rounded to the dtype as apply_rotary's ops round."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, HALF_PAD)
    mask = offs < HALF
    base = qkv_ptr + token * qkv_stride + head * (2 * HALF)
    dtype = qkv_ptr.dtype.element_ty
    x1 = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        is_q = head < num_q_heads
        w1 = tl.where(is_q, tl.load(qw_ptr + offs, mask=mask, other=0.0), tl.load(kw_ptr + offs, mask=mask, other=0.0))
        w2 = tl.where(is_q, tl.load(qw_ptr + HALF + offs, mask=mask, other=0.0),
                      tl.load(kw_ptr + HALF + offs, mask=mask, other=0.0))
        scale = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
        x1 = (x1 * scale * w1.to(tl.float32)).to(dtype).to(tl.float32)
        x2 = (x2 * scale * w2.to(tl.float32)).to(dtype).to(tl.float32)
    cos = tl.load(cos_ptr + token * cos_stride + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * sin_stride + offs, mask=mask, other=0.0).to(tl.float32)
    out1 = (x1 * cos).to(dtype).to(tl.float32) - (x2 * sin).to(dtype).to(tl.float32)
    out2 = (x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)
    tl.store(base + offs, out1.to(dtype), mask=mask)
    tl.store(base + HALF + offs, out2.to(dtype), mask=mask)


def qk_norm_rope_(qkv: torch.Tensor, q_size: int, kv_size: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
                  q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float) -> None:
    """The q and k heads of a fused QKV output ``[tokens, q_size + 2 * kv_size]`` (rows contiguous) normed by
    ``q_weight`` / ``k_weight`` (if given) and rotated by ``cos, sin`` (``[tokens, 1, head_dim // 2]`` views), in
    place; v is left as it is."""
    num_tokens = qkv.shape[0]
    half = head_dim // 2
    num_heads = (q_size + kv_size) // head_dim
    if not num_tokens:
        return
    has_norm = q_weight is not None
    _qk_norm_rope_kernel[(num_tokens, num_heads)](
        qkv, cos, sin, q_weight if has_norm else qkv, k_weight if has_norm else qkv, qkv.stride(0), cos.stride(0),
        sin.stride(0), q_size // head_dim, eps, HAS_NORM=has_norm, HALF=half, HALF_PAD=triton.next_power_of_2(half),
        num_warps=1 if half <= 64 else 2)


@triton.jit
def _act_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, width, ACT: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, block of columns): act(gate) rounded to the dtype, times up, rounded."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + width + offs, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        act = gate / (1.0 + tl.exp(-gate))
    else:
        inner = SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)
        # tanh as 1 - 2 / (e^2x + 1): exact at both tails, and GELU's 1 + tanh forgives its absolute error near 0
        act = 0.5 * gate * (2.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0))
    tl.store(out_ptr + row * out_stride + offs, (act.to(dtype).to(tl.float32) * up).to(dtype), mask=mask)


def act_and_mul(gate_up: torch.Tensor, act: int) -> torch.Tensor:
    """``act(gate) * up`` for ``gate_up`` ``[tokens, 2 * width]`` (rows contiguous): SiLU or tanh-GELU."""
    num_tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(num_tokens, width, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(width))
    if num_tokens:
        _act_and_mul_kernel[(num_tokens, triton.cdiv(width, block))](gate_up, out, gate_up.stride(0), out.stride(0),
                                                                    width, ACT=act, BLOCK=block, num_warps=4)
    return out
