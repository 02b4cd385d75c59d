"""Random paged-cache attention steps, the float64 dense reference they are checked against, and poisoned outputs."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from jido.attention.backend import AttentionBackend, AttentionLayerSpec, AttentionMetadata, build_common_metadata
from jido.attention.kv_quant import dequantize_rows, quantize_rows
from jido.attention.registry import get_attention_backend

HEAD_DIM = 16


@dataclass
class Case:
    """One step: queries and new K/V for a flat batch, a cache holding the cached prefixes, and the metadata."""

    q: torch.Tensor  # [num_tokens, num_heads * head_dim]
    k: torch.Tensor  # [num_tokens, num_kv_heads * head_dim]
    v: torch.Tensor
    kv_cache: torch.Tensor  # in the backend's own layout
    metadata: AttentionMetadata
    backend: AttentionBackend
    full_k: list[torch.Tensor]  # per request, its whole context [seq_len, num_kv_heads, head_dim]
    full_v: list[torch.Tensor]


def make_case(
    requests: list[tuple[int, int]], num_heads: int, num_kv_heads: int, block_size: int, seed: int = 0,
    backend: str | AttentionBackend = "torch", dtype: torch.dtype = torch.float32, head_dim: int = HEAD_DIM,
    kv_cache_dtype: torch.dtype | None = None,
) -> Case:
    """A step of ``requests`` (cached prefix length, query length), the prefixes written through the backend.

    With a quantized ``kv_cache_dtype`` the case's ``full_k``/``full_v`` are the dequantized vectors the
    backend attends over, so the reference checks attention exactly, quantization apart.
    """
    attn = get_attention_backend(backend) if isinstance(backend, str) else backend
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [cached + query for cached, query in requests]
    tables = _block_tables(seq_lens, block_size, gen)
    num_blocks = 1 + sum(len(t) for t in tables)
    cache_dtype = kv_cache_dtype or dtype
    kv_cache = torch.zeros(attn.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim, cache_dtype),
                           dtype=cache_dtype)
    full_k = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype) for n in seq_lens]
    full_v = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype) for n in seq_lens]
    # The cached prefixes were written by earlier steps: write them through the backend, as a prefill.
    cached_lens = [cached for cached, _ in requests]
    if any(cached_lens):
        prefix = [i for i, n in enumerate(cached_lens) if n]
        write = _metadata([cached_lens[i] for i in prefix], [cached_lens[i] for i in prefix],
                          [tables[i] for i in prefix], block_size)
        k = torch.cat([full_k[i][:cached_lens[i]].flatten(1) for i in prefix])
        v = torch.cat([full_v[i][:cached_lens[i]].flatten(1) for i in prefix])
        spec = AttentionLayerSpec(num_kv_heads, num_kv_heads, head_dim, 1.0)
        attn.forward(spec, k, k, v, kv_cache, attn.build_metadata(write))
    query_lens = [query for _, query in requests]
    new_k = torch.cat([k[cached:].flatten(1) for (cached, _), k in zip(requests, full_k)])
    new_v = torch.cat([v[cached:].flatten(1) for (cached, _), v in zip(requests, full_v)])
    q = torch.randn(sum(query_lens), num_heads * head_dim, generator=gen).to(dtype)
    metadata = _metadata(query_lens, seq_lens, tables, block_size)
    if kv_cache_dtype is not None:
        full_k = [dequantize_rows(quantize_rows(k, kv_cache_dtype), head_dim) for k in full_k]
        full_v = [dequantize_rows(quantize_rows(v, kv_cache_dtype), head_dim) for v in full_v]
    return Case(q, new_k, new_v, kv_cache, metadata, attn, full_k, full_v)


def _block_tables(seq_lens: list[int], block_size: int, gen: torch.Generator) -> list[list[int]]:
    """Shuffled, non-contiguous block ids; id 0 stays unused (it pads the block tables)."""
    needed = [-(-n // block_size) for n in seq_lens]
    ids = (torch.randperm(sum(needed), generator=gen) + 1).tolist()
    return [[ids.pop() for _ in range(n)] for n in needed]


def _metadata(query_lens: list[int], seq_lens: list[int], tables: list[list[int]], block_size: int) -> AttentionMetadata:
    width = max(len(t) for t in tables)
    table = np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32)
    return build_common_metadata(query_lens, seq_lens, table, block_size)


def reference(spec: AttentionLayerSpec, case: Case) -> torch.Tensor:
    """Dense float64 attention per request with explicit causal and window masks (float32 result)."""
    outs, start = [], 0
    m, head_dim = case.metadata, spec.head_dim
    for query_len, seq_len, k, v in zip(m.query_lens_list, m.seq_lens_list, case.full_k, case.full_v):
        q = case.q[start : start + query_len].double().view(query_len, spec.num_heads, head_dim).transpose(0, 1)
        group = spec.num_heads // spec.num_kv_heads
        k = k.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [num_heads, seq_len, head_dim]
        v = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q @ k.transpose(1, 2) * spec.scale
        if spec.logit_softcap is not None:
            scores = torch.tanh(scores / spec.logit_softcap) * spec.logit_softcap
        q_pos = torch.arange(seq_len - query_len, seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        visible = k_pos <= q_pos
        if spec.sliding_window is not None:
            visible &= k_pos > q_pos - spec.sliding_window
        out = scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v
        outs.append(out.transpose(0, 1).reshape(query_len, -1))
        start += query_len
    return torch.cat(outs).float()


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Every float tensor made by ``torch.empty`` / ``torch.empty_like`` inside is NaN-filled, so an unwritten
    element of an output buffer shows up as NaN instead of passing by luck with stale memory."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = lambda *args, **kwargs: poison(empty(*args, **kwargs))
    torch.empty_like = lambda *args, **kwargs: poison(empty_like(*args, **kwargs))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def run(spec: AttentionLayerSpec, case: Case) -> torch.Tensor:
    """The backend's output for the case's step, with its output buffers poisoned."""
    metadata = case.backend.build_metadata(case.metadata)
    with poisoned_allocations():
        return case.backend.forward(spec, case.q, case.k, case.v, case.kv_cache, metadata)
