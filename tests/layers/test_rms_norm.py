"""RMSNorm's C++ kernel and its F.rms_norm fallback against float64 math, with and without the residual."""
from __future__ import annotations

import pytest
import torch

from jido.layers import rms_norm as rms_norm_module
from jido.layers.rms_norm import RMSNorm


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.fixture(params=["cpp", "torch"])
def path(request, monkeypatch) -> str:
    if request.param == "torch":
        monkeypatch.setattr(rms_norm_module, "load_norm_ops", lambda: None)
    else:
        assert rms_norm_module.load_norm_ops() is not None, "the C++ RMSNorm kernel did not build here"
    return request.param


@pytest.mark.parametrize("shape", [(1, 640), (7, 3, 256), (5, 33), (0, 16)])
def test_rms_norm_matches_float64_in_float32(path, shape) -> None:
    gen = torch.Generator().manual_seed(len(shape))
    norm = RMSNorm(shape[-1], 1e-6, unit_offset=True)
    norm.weight_loader(norm.weight, torch.randn(shape[-1], generator=gen))
    x, residual = torch.randn(shape, generator=gen) * 5, torch.randn(shape, generator=gen)
    expected = reference(x, norm.weight, 1e-6)
    torch.testing.assert_close(norm(x).double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm(x, residual).double(), residual.double() + expected, rtol=1e-6, atol=1e-6)


def test_rms_norm_in_bf16_rounds_like_the_unfused_ops(path) -> None:
    # One rounding of the float32 norm, then (residual) one of the sum: what F.rms_norm and `+` give in bf16.
    gen = torch.Generator().manual_seed(3)
    x, residual = (torch.randn(9, 640, generator=gen).bfloat16() for _ in range(2))
    weight = (torch.rand(640, generator=gen) + 0.5).bfloat16()
    norm = RMSNorm(640, 1e-6).to(torch.bfloat16)
    norm.weight.data.copy_(weight)
    normed = reference(x, weight, 1e-6).bfloat16()
    for ours, expected in ((norm(x), normed), (norm(x, residual), (residual.float() + normed.float()).bfloat16())):
        assert ours.dtype == torch.bfloat16
        torch.testing.assert_close(ours.float(), expected.float(), rtol=2**-7, atol=0)


def test_rms_norm_takes_a_non_contiguous_view(path) -> None:
    # q/k norms run on a split of the fused qkv output: rows whose stride is not the norm's width.
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(3, 3 * 64, generator=gen)
    q = qkv[:, :128].view(3, 2, 64)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data.copy_(torch.rand(64, generator=gen))
    torch.testing.assert_close(norm(q).double(), reference(q, norm.weight, 1e-6), rtol=1e-6, atol=1e-6)
