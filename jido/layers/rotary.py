"""Rotary position embedding (RoPE, rotate-half layout) with linear and Llama-3.1 frequency scaling."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from jido.layers.rms_norm import RMSNorm, load_norm_ops, triton_ops_for


@dataclass(frozen=True)
class RopeScaling:
    """How a checkpoint stretches RoPE beyond its training length (HF ``rope_scaling``/``rope_parameters``).

    ``rope_type`` is ``"linear"`` (divide every frequency by ``factor``) or ``"llama3"`` (Llama 3.1:
    divide only the low frequencies, blend the middle band; needs the last three fields).
    """

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(f"unsupported rope scaling type {self.rope_type!r}; supported: 'linear', 'llama3'")
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor}")
        llama3_fields = (self.low_freq_factor, self.high_freq_factor, self.original_max_position_embeddings)
        if self.rope_type == "llama3" and None in llama3_fields:
            raise ValueError(
                "llama3 rope scaling needs low_freq_factor, high_freq_factor and original_max_position_embeddings"
            )


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` in float32 on the CPU, computed the way transformers does."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    return _llama3_inv_freq(inv_freq, scaling)


def _llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    # Between the two wavelengths, blend the scaled and unscaled frequency smoothly.
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """A cos/sin table indexed by position, grown on demand (never a per-token Python loop).

    The table is a non-persistent buffer created on the default device in the default dtype (the model's);
    like transformers, cos and sin are computed in float32 and then cast to that dtype.
    """

    def __init__(
        self, head_dim: int, theta: float, scaling: RopeScaling | None = None, initial_len: int = 4096
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        # A plain attribute, not a buffer: it must stay float32 when the model is cast to half precision.
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling)
        # NOTE: the first table is computed on the CPU and then moved, so that building the model on CUDA
        # does not change its values (CUDA's cos/sin may differ from the CPU's in the last bit).
        table = self._table(initial_len, torch.device("cpu")).to(torch.get_default_device(), torch.get_default_dtype())
        self.register_buffer("cos_sin", table, persistent=False)

    def _table(self, length: int, device: torch.device) -> torch.Tensor:
        positions = torch.arange(length, device=device).float()
        freqs = positions[:, None] * self.inv_freq.to(device)[None, :]  # [length, head_dim // 2]
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [length, head_dim]

    def forward(self, positions: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``cos, sin`` of shape ``[num_tokens, 1, head_dim // 2]`` for positions ``< max_len``."""
        if max_len > self.cos_sin.shape[0]:
            # max_len is a Python int from the metadata, so growing needs no device sync.
            length = max(max_len, 2 * self.cos_sin.shape[0])
            self.cos_sin = self._table(length, self.cos_sin.device).to(self.cos_sin.dtype)
        cos, sin = self.cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[num_tokens, num_heads, head_dim]`` in the rotate-half (GPT-NeoX) layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def norm_and_rotate_qk(qkv: torch.Tensor, q_size: int, kv_size: int, head_dim: int, cos: torch.Tensor,
                       sin: torch.Tensor, q_norm: RMSNorm | None = None,
                       k_norm: RMSNorm | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[num_tokens, q_size]`` and k ``[num_tokens, kv_size]`` from a fused QKV output
    ``[num_tokens, q_size + 2 * kv_size]``: each head normed by ``q_norm`` / ``k_norm`` (if given) and rotated by
    ``cos, sin`` (:meth:`RotaryEmbedding.forward`).

    On CPU one C++ call does it in place in ``qkv`` (``csrc/rms_norm.cpp``, ``qk_norm_rope_``), rounding as the
    unfused ops do, so the results are the same bits: a decode step of Gemma 3 270M ran ~20 ATen ops per layer
    for this, each with its dispatch cost. On CUDA one Triton kernel does the same where it pays (``triton_ops_for``):
    ~14 of a layer's ~25 kernels were this. The returned q and k are views of ``qkv`` there, else new tensors.
    It runs once a layer, so the path is chosen with few Python calls: each is a measurable part of a one-row layer.
    """
    num_tokens = qkv.shape[0]
    q_weight = k_weight = None
    if q_norm is not None:
        q_weight, k_weight = q_norm.weight, k_norm.weight
    if (qkv.stride(-1) == 1 and cos.dtype == sin.dtype == qkv.dtype
            and (q_weight is None or q_weight.dtype == k_weight.dtype == qkv.dtype)):
        ops = load_norm_ops() if qkv.is_cpu else triton_ops_for(qkv)
        if ops is not None:
            ops.qk_norm_rope_(qkv, q_size, kv_size, head_dim, cos, sin, q_weight, k_weight,
                              0.0 if q_norm is None else q_norm.eps)
            return qkv[:, :q_size], qkv[:, q_size:q_size + kv_size]  # (split, one call, took longer than two)
    q = qkv[:, :q_size].view(num_tokens, -1, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(num_tokens, -1, head_dim)
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    return apply_rotary(q, cos, sin).view(num_tokens, q_size), apply_rotary(k, cos, sin).view(num_tokens, kv_size)
