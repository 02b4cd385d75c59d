"""Quantized KV cache formats: int8 and fp8 values with a float32 scale per (token, KV head) in each cache row.

A quantized cache stores each token's key (or value) vector of one KV head as one row of ``head_dim + 4``
one-byte elements: ``head_dim`` quantized values, then the 4 bytes of its float32 scale. The scale thus
lives in the same block as its values, so whatever moves, caches or frees a block (prefix caching,
preemption, a copy of block ``b``) carries the scales with it. Scales are symmetric: ``scale = max|x| /
qmax`` with ``qmax`` 127 for int8 and the format's largest finite value for fp8; ``x ~ q * scale``.

NOTE: scales are float32, not float16: bf16 activations have float32's exponent range, so a float16 scale
(max 65504, min normal 6e-5) could overflow or lose precision on very large or very small vectors; the
two extra bytes cost 0.8% of a row at head_dim 256.
"""
from __future__ import annotations

import torch

# vLLM's --kv-cache-dtype names -> the element type stored in the cache.
KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    "int8": torch.int8,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
SCALE_BYTES = 4  # one float32 scale per row


def is_quantized(dtype: torch.dtype) -> bool:
    """Whether a cache of element type ``dtype`` holds quantized rows (values then a scale)."""
    return dtype in KV_CACHE_DTYPES.values()


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements in one (token, KV head) row of a cache of ``dtype``: the values, and the scale's bytes if quantized."""
    return head_dim + SCALE_BYTES if is_quantized(dtype) else head_dim


def qmax(dtype: torch.dtype) -> float:
    """The largest magnitude a quantized value holds: ``max|x|`` maps onto it."""
    return 127.0 if dtype == torch.int8 else torch.finfo(dtype).max


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[..., head_dim + 4]`` of ``dtype`` for vectors ``x`` ``[..., head_dim]``, quantized along the last dim."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / qmax(dtype)  # [..., 1]
    q = xf / torch.where(scale > 0, scale, 1.0)  # an all-zero vector stays zero with scale 0
    if dtype == torch.int8:
        q = q.round_().clamp_(-127, 127)
    else:  # x / scale can round one ulp past the format's max: clamp, or the cast overflows to NaN
        q = q.clamp_(-qmax(dtype), qmax(dtype))
    return torch.cat([q.to(dtype).view(torch.uint8), scale.view(torch.uint8)], dim=-1).view(dtype)


def dequantize_rows(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """float32 vectors ``[..., head_dim]`` from quantized rows ``[..., head_dim + 4]``."""
    scale = rows[..., head_dim:].contiguous().view(torch.float32)  # [..., 1]
    return rows[..., :head_dim].float() * scale


def cache_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` ``[..., head_dim]`` as rows of a cache of ``dtype``: quantized with their scales, or cast."""
    return quantize_rows(x, dtype) if is_quantized(dtype) else x.to(dtype)


def read_rows(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows gathered from a cache as vectors ``[..., head_dim]``: dequantized to float32, or as stored."""
    return dequantize_rows(rows, head_dim) if is_quantized(rows.dtype) else rows


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for ``--kv-cache-dtype``: ``auto`` is the model's dtype.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name == "auto":
        return model_dtype
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {name!r}; choose auto or one of {sorted(KV_CACHE_DTYPES)}")
    return KV_CACHE_DTYPES[name]
