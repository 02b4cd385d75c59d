"""Every attention backend against a float64 dense reference, over paged caches of random shapes."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from paged_cases import HEAD_DIM, Case, make_case, reference, run

from jido.attention.backend import AttentionLayerSpec, AttentionMetadata
from jido.attention.registry import get_attention_backend, supported_attention_backends
from jido.attention import torch_backend
from jido.attention.torch_backend import TorchAttentionBackend, _prefill_attention

MIXED = [(0, 7), (5, 3), (13, 1), (2, 9), (20, 1)]  # (cached prefix length, query length) per request
DECODES = [(0, 1), (6, 1), (17, 1), (33, 1)]
# triton runs CPU tensors only under its interpreter, which tests/conftest.py turns on where CUDA is absent
# (test_triton_backend.py runs it on CUDA tensors where CUDA is present).
CPU_BACKENDS = [name for name in supported_attention_backends() if name != "triton" or (
    importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1")]


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


@pytest.mark.parametrize("window", [None, 12])
@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("backend", ["torch", "tiled"])
def test_long_prompts_in_query_tiles_match_float64_reference(monkeypatch, window: int | None, softcap: float | None,
                                                              backend: str) -> None:
    # Small tiles, so these prompts (fresh, and after a cached prefix) run many tiles, each seeing only its keys.
    monkeypatch.setattr(torch_backend, "SLIDING_QUERY_TILE", 8)
    monkeypatch.setattr(torch_backend, "SLIDING_QUERY_TILE_AMX", 8)
    monkeypatch.setattr(torch_backend, "GLOBAL_QUERY_TILE", 16)
    spec = _spec(4, 1, window, softcap)
    case = make_case([(0, 70), (23, 50), (5, 9)], 4, 1, block_size=4, backend=backend)
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
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_sliding_window_reads_only_blocks_inside_the_window(requests: list[tuple[int, int]], backend: str) -> None:
    window, block_size = 5, 4
    spec = _spec(4, 2, window)
    case = make_case(requests, 4, 2, block_size, backend=backend)
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
    assert {"torch", "tiled", "triton"} <= set(supported_attention_backends())
    with pytest.raises(ValueError, match="unknown attention backend 'flash'; available: \\[.*'torch'.*\\]"):
        get_attention_backend("flash")
