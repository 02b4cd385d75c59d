"""The fused q/k norm + rotary C++ call against the unfused ops (RMSNorm modules, then apply_rotary): same bits.
q and k come back flat, ``[tokens, heads * head_dim]``, as the attention backends take them."""
from __future__ import annotations

import pytest
import torch

from jido.layers import rotary
from jido.layers.rms_norm import RMSNorm, load_norm_ops
from jido.layers.rotary import RotaryEmbedding, apply_rotary, norm_and_rotate_qk


def _unfused(qkv, q_size, kv_size, head_dim, cos, sin, q_norm, k_norm):
    n = qkv.shape[0]
    q, k = qkv[:, :q_size].view(n, -1, head_dim), qkv[:, q_size:q_size + kv_size].view(n, -1, head_dim)
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    return apply_rotary(q, cos, sin).reshape(n, -1), apply_rotary(k, cos, sin).reshape(n, -1)


@pytest.mark.parametrize("table", ["rotary", "rows"])  # cos/sin as RotaryEmbedding gives them, or [tokens, half]
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,with_norm", [(4, 1, 256, True), (8, 2, 64, False), (3, 3, 32, True),
                                                                (2, 1, 8, False)])
def test_fused_qk_norm_and_rotary_equals_the_unfused_ops_bit_for_bit(dtype, heads, kv_heads, head_dim,
                                                                     with_norm, table) -> None:
    assert load_norm_ops() is not None, "the C++ norm kernels did not build here"
    gen = torch.Generator().manual_seed(heads * head_dim)
    tokens, q_size, kv_size = 7, heads * head_dim, kv_heads * head_dim
    with torch.device("cpu"):
        rope = RotaryEmbedding(head_dim, 10_000.0, initial_len=64).to(dtype)
    cos, sin = rope(torch.tensor([0, 3, 5, 9, 17, 40, 63]), 64)
    norms = [None, None]
    if with_norm:
        norms = [RMSNorm(head_dim, 1e-6, unit_offset=True) for _ in range(2)]
        for n in norms:
            n.weight_loader(n.weight, torch.randn(head_dim, generator=gen))
            n.to(dtype)
    qkv = (torch.randn(tokens, q_size + 2 * kv_size, generator=gen) * 3).to(dtype)
    expected = _unfused(qkv.clone(), q_size, kv_size, head_dim, cos, sin, *norms)
    fused = qkv.clone()
    tables = (cos, sin) if table == "rotary" else (cos[:, 0], sin[:, 0])
    q, k = norm_and_rotate_qk(fused, q_size, kv_size, head_dim, *tables, *norms)
    assert q.data_ptr() == fused.data_ptr(), "the C++ path works in place"
    for ours, ref in zip((q, k), expected):
        assert ours.shape == ref.shape and ours.dtype == dtype
        torch.testing.assert_close(ours, ref, atol=0, rtol=0)
    torch.testing.assert_close(fused[:, q_size + kv_size:], qkv[:, q_size + kv_size:], atol=0, rtol=0)  # v untouched


def test_without_the_cpp_kernel_the_unfused_ops_run(monkeypatch) -> None:
    monkeypatch.setattr(rotary, "load_norm_ops", lambda: None)
    qkv = torch.randn(2, 3 * 16)
    with torch.device("cpu"):
        cos, sin = RotaryEmbedding(16, 10_000.0, initial_len=8)(torch.tensor([1, 2]), 8)
    q, k = norm_and_rotate_qk(qkv, 16, 16, 16, cos, sin)
    assert q.data_ptr() != qkv.data_ptr()
    torch.testing.assert_close(q, apply_rotary(qkv[:, :16].view(2, 1, 16), cos, sin).view(2, 16), atol=0, rtol=0)
