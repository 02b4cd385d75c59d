"""The layer ops' Triton kernels (RMSNorm, q/k norm + RoPE, gated activation) against float64 math and the unfused
PyTorch ops: CUDA tensors where CUDA is present (float32 and bf16), else CPU tensors in float32 under Triton's
interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1`` before triton loads)."""
from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it comes with the dev extra: pip install -e '.[dev]')")

from jido.layers import triton_ops  # noqa: E402
from jido.layers.activation import get_gated_activation  # noqa: E402
from jido.layers.rms_norm import TRITON_MIN_ROWS, RMSNorm, for_cuda_graphs, triton_ops_for  # noqa: E402
from jido.layers.rotary import RotaryEmbedding, apply_rotary  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1: triton cannot run CPU tensors", allow_module_level=True)
# The interpreter computes in numpy, which has no bf16: bf16 is checked on a GPU only.
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def _norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def _tolerance(dtype: torch.dtype, atol_bf16: float = 1e-5) -> dict:
    return dict(rtol=2e-6, atol=2e-6) if dtype == torch.float32 else dict(rtol=2**-7, atol=atol_bf16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 640), (5, 33), (3, 2, 256), (0, 16)])
def test_rms_norm_kernel_matches_float64_with_and_without_the_residual(dtype, shape) -> None:
    gen = torch.Generator().manual_seed(shape[-1])
    x, residual = (torch.randn(shape, generator=gen) * 3 for _ in range(2))
    weight = torch.rand(shape[-1], generator=gen) + 0.5
    x, residual, weight = (t.to(DEVICE, dtype) for t in (x, residual, weight))
    expected = _norm_reference(x, weight, 1e-6)
    out = triton_ops.rms_norm(x, weight, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, **_tolerance(dtype))
    # residual + the norm rounded to the dtype, the sum rounded again: what the two PyTorch ops give
    summed = triton_ops.rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(summed.double(), (residual.double() + expected.to(dtype).double()).to(dtype).double(),
                               **_tolerance(dtype))


def test_rms_norm_kernel_reads_rows_of_a_wider_tensor() -> None:
    # A norm of a split: rows whose stride is not the norm's width.
    gen = torch.Generator().manual_seed(4)
    wide = torch.randn(6, 192, generator=gen).to(DEVICE)
    weight = torch.rand(64, generator=gen).to(DEVICE)
    torch.testing.assert_close(triton_ops.rms_norm(wide[:, 64:128], weight, 1e-6).double(),
                               _norm_reference(wide[:, 64:128], weight, 1e-6), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim,with_norm", [(4, 1, 256, True), (8, 2, 64, False), (3, 3, 24, True)])
def test_qk_norm_rope_kernel_equals_the_unfused_ops(dtype, heads, kv_heads, head_dim, with_norm) -> None:
    gen = torch.Generator().manual_seed(heads * head_dim)
    tokens, q_size, kv_size = 7, heads * head_dim, kv_heads * head_dim
    qkv = (torch.randn(tokens, q_size + 2 * kv_size, generator=gen) * 2).to(DEVICE, dtype)
    with torch.device(DEVICE):
        rope = RotaryEmbedding(head_dim, 10000.0).to(dtype)
        q_norm, k_norm = RMSNorm(head_dim, 1e-6).to(dtype), RMSNorm(head_dim, 1e-6).to(dtype)
    q_norm.weight.data.copy_(torch.rand(head_dim, generator=gen) + 0.5)
    k_norm.weight.data.copy_(torch.rand(head_dim, generator=gen) + 0.5)
    cos, sin = rope(torch.tensor([0, 3, 9, 17, 100, 2047, 5], device=DEVICE), 4096)
    q = qkv[:, :q_size].view(tokens, -1, head_dim).double()
    k = qkv[:, q_size:q_size + kv_size].view(tokens, -1, head_dim).double()
    if with_norm:
        q, k = _norm_reference(q, q_norm.weight, 1e-6).to(dtype), _norm_reference(k, k_norm.weight, 1e-6).to(dtype)
    expected_q = apply_rotary(q.to(dtype), cos, sin).reshape(tokens, -1)
    expected_k = apply_rotary(k.to(dtype), cos, sin).reshape(tokens, -1)
    v = qkv[:, q_size + kv_size:].clone()
    triton_ops.qk_norm_rope_(qkv, q_size, kv_size, head_dim, cos, sin, q_norm.weight if with_norm else None,
                             k_norm.weight if with_norm else None, 1e-6)
    # bf16: a product one unit in the last place off (float32 sums inside a norm in another order) moves a
    # difference of two products by up to a unit of the larger one: |values| < 8, units of 2^-5
    torch.testing.assert_close(qkv[:, :q_size], expected_q, **_tolerance(dtype, atol_bf16=2**-5))
    torch.testing.assert_close(qkv[:, q_size:q_size + kv_size], expected_k, **_tolerance(dtype, atol_bf16=2**-5))
    assert torch.equal(qkv[:, q_size + kv_size:], v), "v must be left as it was"


def _act_reference(name: str, gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.double().chunk(2, dim=-1)
    z = gate if name == "silu" else 2 * math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)
    return gate * torch.sigmoid(z) * up


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,act", [("silu", triton_ops.SILU), ("gelu_pytorch_tanh", triton_ops.GELU_TANH)])
@pytest.mark.parametrize("shape", [(1, 2048), (5, 4100), (3, 26), (0, 16)])
def test_act_and_mul_kernel_matches_float64_and_the_aten_ops(dtype, name, act, shape) -> None:
    gen = torch.Generator().manual_seed(shape[0] * 7 + act)
    gate_up = (torch.randn(shape, generator=gen) * 4).to(DEVICE, dtype)
    out = triton_ops.act_and_mul(gate_up, act)
    assert out.shape == (shape[0], shape[1] // 2) and out.dtype == dtype
    if dtype == torch.float32:
        expected = _act_reference(name, gate_up)
        assert torch.all((out.double() - expected).abs() / expected.abs().clamp(min=1) < 4e-6)
    else:  # act rounded to bf16, then the product rounded: ATen's two ops, up to float32 bits inside
        gate, up = gate_up.chunk(2, dim=-1)
        aten = {"silu": torch.nn.functional.silu(gate), "gelu_pytorch_tanh":
                torch.nn.functional.gelu(gate, approximate="tanh")}[name] * up
        torch.testing.assert_close(out, aten, rtol=2**-7, atol=1e-5)


@pytest.mark.skipif(DEVICE != "cuda", reason="the layers dispatch to these kernels for CUDA tensors only")
def test_layers_on_cuda_take_the_kernels_where_they_pay_and_give_the_unfused_values() -> None:
    few, many = torch.empty(4, 8, device="cuda"), torch.empty(TRITON_MIN_ROWS, 8, device="cuda")
    assert triton_ops_for(many) is triton_ops and triton_ops_for(few) is None  # eager: launching costs more
    with for_cuda_graphs():
        assert triton_ops_for(few) is triton_ops  # every replay of a graph runs them without launching them
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(TRITON_MIN_ROWS, 640, generator=gen).cuda().bfloat16()
    norm = RMSNorm(640, 1e-6).cuda().bfloat16()
    norm.weight.data.copy_(torch.rand(640, generator=gen) + 0.5)
    fused = norm(x)
    torch.testing.assert_close(fused.float(), torch.nn.functional.rms_norm(x, (640,), norm.weight, 1e-6).float(),
                               rtol=2**-7, atol=1e-5)
    gate_up = torch.randn(TRITON_MIN_ROWS, 2048, generator=gen).cuda().bfloat16()
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(get_gated_activation("gelu_pytorch_tanh")(gate_up),
                               torch.nn.functional.gelu(gate, approximate="tanh") * up, rtol=2**-7, atol=1e-5)
