"""The integer decoders of GGML blocks reproduce the gguf package's own dequantization exactly."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from jido.models import gguf_blocks

T = GGMLQuantizationType
# Byte offsets of the fp16 scales in each block: random bytes there could be NaN or infinity.
_F16_AT = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q4_K: [0, 2],
           T.Q5_K: [0, 2], T.Q6_K: [208]}


def _random_blocks(tensor_type: GGMLQuantizationType, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes are valid blocks of every type once their fp16 scales are finite."""
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // block_size, type_size), dtype=np.uint8)
    for at in _F16_AT[tensor_type]:
        scales = rng.uniform(-0.05, 0.05, blocks.shape[0]).astype(np.float16)
        blocks[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("tensor_type", sorted(_F16_AT, key=lambda t: t.name))
def test_codes_times_scales_plus_offsets_equal_gguf_dequantize(tensor_type):
    rows, cols = 3, 512
    data = _random_blocks(tensor_type, rows, cols, seed=tensor_type.value)
    codes = gguf_blocks.decode(data, tensor_type, (rows, cols))
    groups = cols // codes.group_size
    assert codes.q.dtype == np.int8 and codes.q.shape == (rows, cols)
    assert codes.scales.shape == (rows, groups)
    expanded = lambda a: np.repeat(a, codes.group_size, axis=1)  # noqa: E731 - one line, used twice
    values = expanded(codes.scales) * codes.q.astype(np.float32)
    if codes.offsets is not None:
        values = values + expanded(codes.offsets)
    reference = dequantize(data, tensor_type).reshape(rows, cols)
    np.testing.assert_allclose(values, reference, rtol=1e-6, atol=1e-7)


def test_four_bit_types_decode_to_codes_in_0_15_and_signed_types_keep_their_sign():
    q4 = gguf_blocks.decode(_random_blocks(T.Q4_K, 2, 256, 0), T.Q4_K, (2, 256)).q
    q6 = gguf_blocks.decode(_random_blocks(T.Q6_K, 2, 256, 0), T.Q6_K, (2, 256)).q
    assert q4.min() >= 0 and q4.max() <= 15
    assert q6.min() >= -32 and q6.max() <= 31 and q6.min() < 0


def test_unsupported_type_and_wrong_size_are_refused_by_name():
    with pytest.raises(ValueError, match="Q2_K has no integer decoder"):
        gguf_blocks.decode(np.zeros((1, 84), np.uint8), T.Q2_K, (1, 256))
    with pytest.raises(ValueError, match=r"does not hold a \[2, 64\] tensor"):
        gguf_blocks.decode(np.zeros((1, 34), np.uint8), T.Q8_0, (2, 64))


@pytest.mark.skipif(gguf_blocks.load_decode_ops() is None, reason="the C++ decoders did not build here")
@pytest.mark.parametrize("tensor_type", [T.Q4_K, T.Q6_K])
def test_the_cpp_decoders_give_the_numpy_decoders_codes_and_scales_bit_for_bit(tensor_type):
    rows, cols = 5, 1024
    data = _random_blocks(tensor_type, rows, cols, seed=7)
    # Some scales out of the ordinary: f16 subnormals, infinities and NaN must convert as numpy converts them.
    at = _F16_AT[tensor_type][0]
    odd = np.array([6e-8, np.inf, -np.inf, np.nan, -0.0], np.float16).view(np.uint8).reshape(-1, 2)
    blocks = data.reshape(-1, GGML_QUANT_SIZES[tensor_type][1])
    blocks[:len(odd), at:at + 2] = odd
    ours = gguf_blocks.decode(data, tensor_type, (rows, cols))
    reference = gguf_blocks.decode(data, tensor_type, (rows, cols), reference=True)
    assert ours.group_size == reference.group_size
    assert np.array_equal(ours.q, reference.q)
    for a, b in [(ours.scales, reference.scales), (ours.offsets, reference.offsets)]:
        assert (a is None) == (b is None)
        assert a is None or np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("tensor_type", sorted(_F16_AT, key=lambda t: t.name))
def test_dequantize_gives_the_gguf_packages_float32_bits_for_every_type_it_claims(tensor_type):
    rows, cols = 4, 1024
    data = _random_blocks(tensor_type, rows, cols, seed=100 + tensor_type.value)
    reference = dequantize(data, tensor_type).reshape(rows, cols)
    ours = gguf_blocks.dequantize(data, tensor_type, (rows, cols)).numpy()
    assert ours.dtype == np.float32 and ours.shape == (rows, cols)
    if gguf_blocks.dequantizes_exactly(tensor_type):
        assert np.array_equal(ours.view(np.uint32), reference.view(np.uint32))
    else:  # Q4_0: d * q - 8 * d rounds twice where the package's d * (q - 8) rounds once
        assert tensor_type == T.Q4_0
        np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("tensor_type", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("reference", [False, True], ids=["cpp", "numpy"])
def test_k_quant_scales_pack_as_integers_under_their_super_blocks_factors_with_the_same_values(tensor_type, reference):
    # decode hands over each super-block's d (and -dmin); pack then holds the group scales (and offsets) as the int8
    # sc (and m) under them, and widens them back to the decoder's float32 values bit for bit.
    import torch

    from jido.layers import quant_kernels as qk

    rows, cols = 3, 512
    codes = gguf_blocks.decode(_random_blocks(tensor_type, rows, cols, seed=7), tensor_type, (rows, cols), reference)
    assert codes.scale_supers.shape == (rows, cols // gguf_blocks.QK_K)
    assert (codes.offset_supers is None) == (codes.offsets is None)
    q = torch.from_numpy(codes.q).clamp(-128, 127)
    offsets = None if codes.offsets is None else torch.from_numpy(codes.offsets)
    supers = [None if s is None else torch.from_numpy(s) for s in (codes.scale_supers, codes.offset_supers)]
    w = qk.pack(q, torch.from_numpy(codes.scales), offsets, codes.group_size, 8, *supers)
    assert w.scales.dtype == torch.int8 and w.scale_supers is not None
    assert torch.equal(w.float_scales, torch.from_numpy(codes.scales))
    if offsets is not None:
        assert w.mins.dtype == torch.int8 and torch.equal(w.float_mins, offsets)


def test_a_merged_projection_of_k_quant_shards_keeps_integer_scales_with_the_same_values():
    # Qwen's qkv: Q4_K shards (groups of 32, offsets) beside a Q6_K one (groups of 16, none): merged in groups of 16,
    # the Q6_K shard's offsets zeros under zero factors.
    import torch

    from jido.layers.quantized_linear import QuantizedCodes, merge_codes

    def shard(tensor_type, rows, seed):
        c = gguf_blocks.decode(_random_blocks(tensor_type, rows, 256, seed), tensor_type, (rows, 256))
        t = lambda a: None if a is None else torch.from_numpy(a)  # noqa: E731
        return QuantizedCodes(t(c.q), t(c.scales), t(c.offsets), c.group_size, tensor_type.name, t(c.scale_supers),
                              t(c.offset_supers))

    merged = merge_codes([shard(T.Q4_K, 4, 1), shard(T.Q4_K, 2, 2), shard(T.Q6_K, 2, 3)])
    assert merged.group_size == 16 and merged.scale_supers.shape == (8, 1)
    packed = merged.pack()
    assert packed.scales.dtype == torch.int8
    assert torch.equal(packed.float_scales, merged.scales) and torch.equal(packed.float_mins, merged.offsets)
