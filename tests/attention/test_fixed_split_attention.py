"""The tiled backend under batch_invariant: a query row's attention is the same bits whether its request's tokens come
as a whole prompt, in chunks of any size, one at a time (decode), or beside other requests in the step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from jido.attention import cpu_extension
from jido.attention.backend import AttentionLayerSpec, build_common_metadata
from jido.attention.kv_quant import row_width
from jido.attention.registry import get_attention_backend
from jido.attention.tiled_backend import TiledAttentionBackend

pytestmark = pytest.mark.skipif(cpu_extension.load_paged_decode() is None, reason="the C++ decode kernel did not build")

BLOCK_SIZE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 4, 1, 32
CONTEXT = 70  # the request under test; the other request's context is 45


class Request:
    """One request's queries, keys and values for its whole context, and its blocks (shuffled) in the cache."""

    def __init__(self, length: int, block_ids: list[int], dtype: torch.dtype, gen: torch.Generator) -> None:
        self.length, self.block_ids = length, block_ids
        self.q = torch.randn(length, NUM_HEADS * HEAD_DIM, generator=gen).to(dtype)
        self.k = torch.randn(length, NUM_KV_HEADS * HEAD_DIM, generator=gen).to(dtype)
        self.v = torch.randn(length, NUM_KV_HEADS * HEAD_DIM, generator=gen).to(dtype)


def step(backend: TiledAttentionBackend, spec: AttentionLayerSpec, cache: torch.Tensor,
         parts: list[tuple[Request, int, int]]) -> list[torch.Tensor]:
    """One step computing rows [start, end) of each part's request (its keys before ``start`` already cached)."""
    width = max(len(r.block_ids) for r, _, _ in parts)
    table = np.array([r.block_ids + [0] * (width - len(r.block_ids)) for r, _, _ in parts], dtype=np.int32)
    metadata = build_common_metadata([end - start for _, start, end in parts], [end for _, _, end in parts], table,
                                     BLOCK_SIZE)
    q, k, v = (torch.cat([getattr(r, name)[start:end] for r, start, end in parts]) for name in ("q", "k", "v"))
    out = backend.forward(spec, q, k, v, cache, backend.build_metadata(metadata))
    return list(out.split([end - start for _, start, end in parts]))


@pytest.mark.parametrize("dtype, cache_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                                (torch.float32, torch.int8)], ids=["float32", "bf16", "int8-cache"])
@pytest.mark.parametrize("window", [None, 13], ids=["full", "window-13"])
def test_a_rows_attention_is_the_same_bits_in_a_prompt_in_chunks_in_decode_and_beside_others(dtype, cache_dtype,
                                                                                             window) -> None:
    backend = get_attention_backend("tiled", batch_invariant=True)
    backend.decode_split_blocks = 3  # splits of 12 keys: each context spans several
    spec = AttentionLayerSpec(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, window, 20.0)
    gen = torch.Generator().manual_seed(0)
    ids = (torch.randperm(40, generator=gen) + 1).tolist()
    ours, other = Request(CONTEXT, ids[:18], dtype, gen), Request(45, ids[18:30], dtype, gen)
    cache_dtype = cache_dtype or dtype
    shape = backend.get_kv_cache_shape(41, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, cache_dtype)
    assert shape[-1] == row_width(HEAD_DIM, cache_dtype)
    cache = torch.zeros(shape, dtype=cache_dtype)

    whole = step(backend, spec, cache, [(ours, 0, CONTEXT)])[0]
    runs = {"decode": [step(backend, spec, cache, [(ours, i, i + 1)])[0] for i in range(CONTEXT)]}
    for size in (7, 16, 17, 40):
        runs[f"chunks of {size}"] = [step(backend, spec, cache, [(ours, i, min(i + size, CONTEXT))])[0]
                                     for i in range(0, CONTEXT, size)]
    # A chunk after the other request's prompt, then a suffix after it and beside one of its decodes.
    beside = step(backend, spec, cache, [(other, 0, 45), (ours, 0, 30)])[1]
    suffix = step(backend, spec, cache, [(other, 44, 45), (ours, 30, CONTEXT)])[1]
    runs["beside another request"] = [beside, suffix]
    for name, parts in runs.items():
        assert torch.equal(torch.cat(parts), whole), name


def test_only_the_tiled_backend_has_a_batch_invariant_route() -> None:
    assert get_attention_backend("tiled", batch_invariant=True).max_decode_rows > CONTEXT
    with pytest.raises(ValueError, match="attention backend 'torch' has no batch-invariant route; use tiled"):
        get_attention_backend("torch", batch_invariant=True)


def test_the_batch_invariant_backend_needs_the_cpp_decode_kernel() -> None:
    with pytest.raises(RuntimeError, match="batch_invariant attends every row with the C\\+\\+ paged decode kernel"):
        TiledAttentionBackend(use_cpp_decode=False, batch_invariant=True)
