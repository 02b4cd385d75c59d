"""KV codecs: raw is exact, int8 and cachegen stay within their quantization step of a float64 reference."""
from __future__ import annotations

import pytest
import torch

from jido.kvtransfer.codecs import cachegen_bits, make_codec

LAYERS = (0, 7, 17)  # one layer from each third of an 18-layer model: 8, 6 and 5 bits under cachegen


def _block(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # [layers, K/V, tokens, kv heads, head_dim]; a smooth walk along the tokens, as real keys are
    gen = torch.Generator().manual_seed(0)
    steps = 0.1 * torch.randn(3, 2, 16, 2, 32, generator=gen, dtype=torch.float64)
    return (torch.randn(3, 2, 1, 2, 32, generator=gen, dtype=torch.float64) + steps.cumsum(dim=2)).to(dtype)


def _roundtrip(name: str, block: torch.Tensor) -> tuple[torch.Tensor, int]:
    codec = make_codec(name, 18, block.dtype)
    data = codec.encode(block, LAYERS)
    return codec.decode(memoryview(data), tuple(block.shape), block.dtype, LAYERS), len(data)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_raw_codec_gives_back_the_same_bits(dtype):
    block = _block(dtype)
    decoded, size = _roundtrip("raw", block)
    assert torch.equal(decoded.view(torch.uint8), block.view(torch.uint8)) and size == block.numel() * block.element_size()


@pytest.mark.parametrize("name, bits", [("int8", [8, 8, 8]), ("cachegen", [8, 6, 5])])
def test_quantizing_codecs_err_by_at_most_half_a_step_of_each_channels_scale(name, bits):
    block = _block()
    decoded, _ = _roundtrip(name, block)
    exact = block.double()
    for layer, layer_bits in enumerate(bits):
        # Each channel's step is its max |x| over the tokens / (2^(bits-1) - 1), rounded to float16.
        step = exact[layer].abs().amax(dim=1, keepdim=True) / (2 ** (layer_bits - 1) - 1)
        error = (decoded[layer].double() - exact[layer]).abs()
        assert (error <= 0.5 * step * 1.01 + 1e-6).all(), (name, layer)
        assert error.max() > 0.05 * step.max()  # it did quantize


def test_cachegen_gives_early_layers_more_bits():
    assert [cachegen_bits(i, 18) for i in (0, 5, 6, 11, 12, 17)] == [8, 8, 6, 6, 5, 5]


def test_int8_and_cachegen_shrink_a_float32_block():
    block = _block()
    raw = block.numel() * 4
    int8_size, cachegen_size = _roundtrip("int8", block)[1], _roundtrip("cachegen", block)[1]
    # int8: a byte per value plus a float16 scale per channel; cachegen's deltas along tokens compress further.
    assert int8_size == block.numel() + 2 * 3 * 2 * 2 * 32
    assert cachegen_size < int8_size < raw / 3


def test_a_quantizing_codec_refuses_an_already_quantized_cache():
    with pytest.raises(ValueError, match="already holds quantized int8 rows: use codec 'raw'"):
        make_codec("cachegen", 18, torch.int8)
