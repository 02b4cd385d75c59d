"""Every attention backend against a float64 dense reference, over paged caches of random shapes."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from jido.attention.backend import AttentionBackend, AttentionLayerSpec, AttentionMetadata, build_common_metadata
from jido.attention.registry import get_attention_backend, supported_attention_backends
from jido.attention.torch_backend import TorchAttentionBackend, _prefill_attention

HEAD_DIM = 16
MIXED = [(0, 7), (5, 3), (13, 1), (2, 9), (20, 1)]  # (cached prefix length, query length) per request
DECODES = [(0, 1), (6, 1), (17, 1), (33, 1)]
# triton runs CPU tensors only under its interpreter, which tests/conftest.py turns on where CUDA is absent
# (test_triton_backend.py runs it on CUDA tensors where CUDA is present).
CPU_BACKENDS = [name for name in supported_attention_backends() if name != "triton" or (
    importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1")]


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
    backend: str = "torch",
) -> Case:
    attn = get_attention_backend(backend)
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [cached + query for cached, query in requests]
    tables = _block_tables(seq_lens, block_size, gen)
    num_blocks = 1 + sum(len(t) for t in tables)
    kv_cache = torch.zeros(attn.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, HEAD_DIM))
    full_k = [torch.randn(n, num_kv_heads, HEAD_DIM, generator=gen) for n in seq_lens]
    full_v = [torch.randn(n, num_kv_heads, HEAD_DIM, generator=gen) for n in seq_lens]
    # The cached prefixes were written by earlier steps: write them through the backend, as a prefill.
    cached_lens = [cached for cached, _ in requests]
    if any(cached_lens):
        prefix = [i for i, n in enumerate(cached_lens) if n]
        write = _metadata([cached_lens[i] for i in prefix], [cached_lens[i] for i in prefix],
                          [tables[i] for i in prefix], block_size)
        k = torch.cat([full_k[i][:cached_lens[i]].flatten(1) for i in prefix])
        v = torch.cat([full_v[i][:cached_lens[i]].flatten(1) for i in prefix])
        spec = AttentionLayerSpec(num_kv_heads, num_kv_heads, HEAD_DIM, 1.0)
        attn.forward(spec, k, k, v, kv_cache, attn.build_metadata(write))
    query_lens = [query for _, query in requests]
    new_k = torch.cat([k[cached:].flatten(1) for (cached, _), k in zip(requests, full_k)])
    new_v = torch.cat([v[cached:].flatten(1) for (cached, _), v in zip(requests, full_v)])
    q = torch.randn(sum(query_lens), num_heads * HEAD_DIM, generator=gen)
    metadata = _metadata(query_lens, seq_lens, tables, block_size)
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
    """Dense float64 attention per request with explicit causal and window masks."""
    outs, start = [], 0
    m = case.metadata
    for query_len, seq_len, k, v in zip(m.query_lens_list, m.seq_lens_list, case.full_k, case.full_v):
        q = case.q[start : start + query_len].double().view(query_len, spec.num_heads, HEAD_DIM).transpose(0, 1)
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


def run(spec: AttentionLayerSpec, case: Case) -> torch.Tensor:
    metadata = case.backend.build_metadata(case.metadata)
    return case.backend.forward(spec, case.q, case.k, case.v, case.kv_cache, metadata)


def _spec(
    num_heads: int, num_kv_heads: int, window: int | None = None, softcap: float | None = None
) -> AttentionLayerSpec:
    return AttentionLayerSpec(num_heads, num_kv_heads, HEAD_DIM, HEAD_DIM**-0.5, window, softcap)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("requests", [MIXED, DECODES], ids=["mixed", "decode_only"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_matches_float64_reference(block_size: int, num_heads: int, num_kv_heads: int, window: int | None,
                                   softcap: float | None, requests: list[tuple[int, int]], backend: str) -> None:
    spec = _spec(num_heads, num_kv_heads, window, softcap)
    case = make_case(requests, num_heads, num_kv_heads, block_size, backend=backend)
    torch.testing.assert_close(run(spec, case), reference(spec, case), atol=2e-5, rtol=0)


def test_new_keys_and_values_land_in_their_slots() -> None:
    case = make_case(MIXED, 4, 2, block_size=4)
    run(_spec(4, 2), case)
    for cache, new in ((case.kv_cache[0], case.k), (case.kv_cache[1], case.v)):
        torch.testing.assert_close(cache.reshape(-1, 2 * HEAD_DIM)[case.metadata.slot_mapping], new, atol=0, rtol=0)


@pytest.mark.parametrize("window", [None, 5])
def test_batched_decode_path_equals_per_request_path(window: int | None) -> None:
    spec = _spec(4, 2, window)
    case = make_case(DECODES, 4, 2, block_size=4)
    batched = run(spec, case).view(len(DECODES), 4, HEAD_DIM)
    for i, seq_len in enumerate(case.metadata.seq_lens_list):
        q = case.q[i].view(1, 4, HEAD_DIM)
        alone = _prefill_attention(spec, q, case.kv_cache, case.metadata.block_tables[i], seq_len)
        torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-6, rtol=0)


@pytest.mark.parametrize("requests", [MIXED, DECODES], ids=["mixed", "decode_only"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_request_output_is_the_same_batched_or_alone(requests: list[tuple[int, int]], backend: str) -> None:
    spec = _spec(4, 2, window=5, softcap=None)
    together = run(spec, make_case(requests, 4, 2, block_size=4, backend=backend)).split([q for _, q in requests])
    for i in range(len(requests)):
        alone = _only(make_case(requests, 4, 2, block_size=4, backend=backend), i)
        torch.testing.assert_close(run(spec, alone), together[i], atol=0, rtol=0)


def _only(case: Case, i: int) -> Case:
    """The same cache and blocks, with a batch holding request ``i`` alone."""
    m = case.metadata
    start, end = m.query_start_loc[i].item(), m.query_start_loc[i + 1].item()
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor([0, end - start], dtype=torch.int32),
        seq_lens=m.seq_lens[i : i + 1],
        block_tables=m.block_tables[i : i + 1],
        slot_mapping=m.slot_mapping[start:end],
        block_size=m.block_size,
        query_lens_list=[end - start],
        seq_lens_list=[m.seq_lens_list[i]],
    )
    rows = slice(start, end)
    only_i = slice(i, i + 1)
    return Case(case.q[rows], case.k[rows], case.v[rows], case.kv_cache, metadata, case.backend,
                case.full_k[only_i], case.full_v[only_i])


@pytest.mark.parametrize("requests", [MIXED, DECODES], ids=["mixed", "decode_only"])
def test_sliding_window_reads_only_blocks_inside_the_window(requests: list[tuple[int, int]]) -> None:
    window, block_size = 5, 4
    spec = _spec(4, 2, window)
    case = make_case(requests, 4, 2, block_size)
    m = case.metadata
    for table, seq_len, query_len in zip(m.block_tables, m.seq_lens_list, m.query_lens_list):
        first_visible = max(0, seq_len - query_len - window + 1)
        # Blocks wholly before the first visible key must not be read: poison them.
        case.kv_cache[:, table[: first_visible // block_size].long()] = float("nan")
    out = run(spec, case)
    assert not out.isnan().any()
    torch.testing.assert_close(out, reference(spec, case), atol=2e-5, rtol=0)


def test_registry_returns_the_torch_backend_and_rejects_unknown_names() -> None:
    assert isinstance(get_attention_backend(), TorchAttentionBackend)
    assert get_attention_backend("torch").name == "torch"
    with pytest.raises(ValueError, match="unknown attention backend 'flash'.*available: \\['torch', 'triton'\\]"):
        get_attention_backend("flash")
