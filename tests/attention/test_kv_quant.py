"""Quantized KV caches (int8, fp8): round trips within each format's error, and every backend's attention over
them equal to float64 attention over the dequantized keys and values."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch
from paged_cases import make_case, reference, run

from jido.attention.backend import AttentionLayerSpec, build_common_metadata
from jido.attention.cpu_extension import load_paged_decode
from jido.attention.kv_quant import (KV_CACHE_DTYPES, SCALE_BYTES, dequantize_rows, quantize_rows,
                                     resolve_kv_cache_dtype)
from jido.attention.tiled_backend import TiledAttentionBackend
from jido.config import CacheConfig
from jido.core.kv_cache_spec import FullAttentionSpec, make_kv_cache_config

QUANTIZED = list(KV_CACHE_DTYPES.values())
IDS = list(KV_CACHE_DTYPES)
MIXED = [(0, 7), (5, 3), (13, 1), (2, 9), (20, 1), (40, 1)]  # (cached prefix length, query length)
HAS_TRITON = importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1"


def _vectors(head_dim: int = 64) -> torch.Tensor:
    """Rows over 20 decades of magnitude, with outliers, and an all-zero row."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(400, head_dim, generator=gen) * torch.logspace(-10, 10, 400)[:, None]
    x[::7, 3] *= 50.0
    x[0] = 0.0
    return x


def test_int8_round_trip_is_within_half_a_step() -> None:
    x = _vectors()
    rows = quantize_rows(x, torch.int8)
    assert rows.shape == (400, 64 + SCALE_BYTES) and rows.dtype == torch.int8
    scale = rows[:, 64:].contiguous().view(torch.float32)  # [400, 1]
    torch.testing.assert_close(scale, x.abs().amax(-1, keepdim=True) / 127, atol=0, rtol=0)
    error = (x - dequantize_rows(rows, 64)).abs()
    assert (error <= scale / 2 * (1 + 1e-6)).all()
    assert (dequantize_rows(rows, 64)[0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["fp8_e4m3", "fp8_e5m2"])
def test_fp8_round_trip_is_within_half_an_ulp(dtype: torch.dtype) -> None:
    x = _vectors()
    rows = quantize_rows(x, dtype)
    scale = rows[:, 64:].contiguous().view(torch.float32)
    info = torch.finfo(dtype)
    torch.testing.assert_close(scale, x.abs().amax(-1, keepdim=True) / info.max, atol=0, rtol=0)
    # Half an ulp of |x| in the format's normal range; below it, half the subnormal step (both in x's units).
    mantissa_bits = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}[dtype]
    half_ulp = 2.0 ** -(mantissa_bits + 1)
    bound = torch.maximum(x.abs() * half_ulp, scale * info.smallest_normal * half_ulp)
    error = (x - dequantize_rows(rows, 64)).abs()
    assert (error <= bound * (1 + 1e-5)).all()
    assert rows.view(torch.uint8)[:, :64].float().isfinite().all() and dequantize_rows(rows, 64).isfinite().all()


BACKENDS = {
    "torch": lambda: "torch",
    "tiled": TiledAttentionBackend,
    "tiled_torch_decode": lambda: TiledAttentionBackend(use_cpp_decode=False),
    # Tiles of 3 queries and 2 blocks, decode splits of 1 block: every merge and rescale path runs.
    "tiled_tiny_tiles": lambda: TiledAttentionBackend(query_tile=3, key_tile_blocks=2, decode_split_blocks=1,
                                                      dense_prefill_max_scores=0),
    **({"triton": lambda: "triton"} if HAS_TRITON else {}),
}


@pytest.mark.parametrize("window,softcap", [(None, None), (5, 2.0)], ids=["full", "window_softcap"])
@pytest.mark.parametrize("kv_dtype", QUANTIZED, ids=IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_over_a_quantized_cache_matches_float64_over_dequantized_kv(
        backend: str, kv_dtype: torch.dtype, window: int | None, softcap: float | None) -> None:
    spec = AttentionLayerSpec(4, 2, 32, 32**-0.5, window, softcap)
    case = make_case(MIXED, 4, 2, block_size=4, backend=BACKENDS[backend](), head_dim=32, kv_cache_dtype=kv_dtype)
    torch.testing.assert_close(run(spec, case), reference(spec, case), atol=2e-5, rtol=0)


@pytest.mark.parametrize("kv_dtype", QUANTIZED, ids=IDS)
@pytest.mark.parametrize("cpp_decode", [True, False], ids=["cpp_decode", "torch_decode"])
def test_bf16_queries_over_a_quantized_cache_match_float64_within_bf16(cpp_decode: bool, kv_dtype: torch.dtype) -> None:
    spec = AttentionLayerSpec(8, 1, 256, 256**-0.5)  # Gemma 3 270M's heads
    backend = TiledAttentionBackend(use_cpp_decode=cpp_decode)
    case = make_case(MIXED, 8, 1, 16, backend=backend, dtype=torch.bfloat16, head_dim=256, kv_cache_dtype=kv_dtype)
    out = run(spec, case)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(spec, case), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", ["torch", "tiled"])
def test_the_kv_write_stores_each_row_quantized_with_its_scale(backend: str) -> None:
    case = make_case(MIXED, 4, 2, block_size=4, backend=backend, head_dim=32, kv_cache_dtype=torch.int8)
    run(AttentionLayerSpec(4, 2, 32, 32**-0.5), case)
    # [2, blocks, block_size, kv_heads, width] in both backends' slot order
    cache = case.kv_cache if backend == "torch" else case.kv_cache.transpose(2, 3)
    for plane, new in ((cache[0], case.k), (cache[1], case.v)):
        stored = plane.reshape(-1, 2, 32 + SCALE_BYTES)[case.metadata.slot_mapping]
        assert torch.equal(stored, quantize_rows(new.view(-1, 2, 32), torch.int8))


def test_kv_capacity_grows_by_the_bytes_per_token_ratio() -> None:
    # Gemma 3 270M's layers: one KV head of 256; bf16 (2 bytes) against int8 plus a 4-byte scale per row.
    bf16 = FullAttentionSpec(16, 1, 256, dtype_bytes=2)
    int8 = FullAttentionSpec(16, 1, 256, dtype_bytes=1, scale_bytes=SCALE_BYTES)
    assert (bf16.page_size_bytes, int8.page_size_bytes) == (2 * 16 * 512, 2 * 16 * 260)
    budget = 64 * 1024 * 1024
    blocks = [make_kv_cache_config({i: spec for i in range(18)}, budget).num_blocks for spec in (bf16, int8)]
    assert blocks == [budget // (18 * 16384), budget // (18 * 8320)]  # 227 and 448: 1.97x the tokens


def test_kv_cache_dtype_names_are_vllms_and_others_are_refused() -> None:
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.bfloat16) == torch.float8_e4m3fn
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \['auto', 'int8', 'fp8_e4m3', 'fp8_e5m2'\], "
                                         r"got 'fp8'"):
        CacheConfig(kv_cache_dtype="fp8")


@pytest.mark.skipif(not HAS_TRITON, reason="triton runs CPU tensors only under its interpreter")
def test_triton_refuses_a_quantized_cache_whose_scales_it_cannot_read_in_place() -> None:
    from jido.attention.triton_backend import TritonAttentionBackend

    assert TritonAttentionBackend.get_kv_cache_shape(3, 4, 2, 8, torch.int8) == (2, 3, 4, 2, 12)
    with pytest.raises(ValueError, match=r"needs head_dim divisible by 4 \(got 6\); use kv_cache_dtype='auto'"):
        TritonAttentionBackend.get_kv_cache_shape(3, 4, 2, 6, torch.int8)


def _every_fp8_value_cache(kv_dtype: torch.dtype, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache whose value rows hold all 256 bit patterns of ``kv_dtype`` (NaN and inf ones zeroed), 16 per
    row, scale 1, in each of blocks 1..16; in block ``b + 1`` only key ``b`` is non-zero (1.0, scale 100), so a
    decode over block ``b + 1`` with a query of ones returns value row ``b`` exactly. Also those rows as floats."""
    bits = torch.arange(256, dtype=torch.uint8)
    bits[~bits.view(kv_dtype).float().isfinite()] = 0
    one = torch.ones(1).to(kv_dtype).view(torch.uint8)
    cache = torch.zeros(2, 17, 16, 1, 20, dtype=torch.uint8)  # the torch layout: [2, blocks, block_size, heads, width]
    cache[1, 1:, :, 0] = torch.cat([bits.view(16, 16), torch.ones(16, 1).view(torch.uint8)], dim=1)
    for b in range(16):
        cache[0, b + 1, b, 0] = torch.cat([one.expand(16), torch.full((1,), 100.0).view(torch.uint8)])
    cache = cache if layout == "torch" else cache.transpose(2, 3).contiguous()
    return cache.view(kv_dtype), bits.view(kv_dtype).float().view(16, 16)


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["fp8_e4m3", "fp8_e5m2"])
def test_cpp_decode_reads_every_fp8_bit_pattern_as_torch_does(kv_dtype: torch.dtype) -> None:
    cache, expected = _every_fp8_value_cache(kv_dtype, "tiled")
    out = torch.empty(16, 1, 16)
    load_paged_decode()(out, torch.ones(16, 1, 16), cache, torch.arange(1, 17, dtype=torch.int32)[:, None],
                        torch.full((16,), 16, dtype=torch.int32), 1.0, 0, 0.0, 1)
    torch.testing.assert_close(out.view(16, 16), expected, atol=0, rtol=0)


@pytest.mark.skipif(not HAS_TRITON, reason="triton runs CPU tensors only under its interpreter")
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["fp8_e4m3", "fp8_e5m2"])
def test_triton_attention_reads_every_fp8_bit_pattern_as_torch_does(kv_dtype: torch.dtype) -> None:
    from jido.attention.triton_backend import TritonAttentionBackend, unified_attention

    cache, expected = _every_fp8_value_cache(kv_dtype, "torch")
    common = build_common_metadata([1] * 16, [16] * 16, np.arange(1, 17, dtype=np.int32)[:, None], 16)
    out = torch.empty(16, 16)
    unified_attention(AttentionLayerSpec(1, 1, 16, 1.0), torch.ones(16, 16), cache, out,
                      TritonAttentionBackend().build_metadata(common))
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
