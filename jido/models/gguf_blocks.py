"""Decodes GGML quantization blocks into integer codes with a scale and an offset per group, without rounding.

Every GGML type below stores a weight as ``w = scale * q + offset`` for groups of 16 or 32 consecutive values
in a row (K-quants nest the group scales in 256-value super-blocks: ``scale = d * sc``, ``offset = -dmin * m``).
Decoding each block into its integer codes ``q`` and float32 ``scale`` / ``offset`` keeps the file's exact
values, so a kernel that computes ``scale * q + offset`` reproduces llama.cpp's weights, and nothing has to
be re-quantized. The bit layouts follow the ``gguf`` package's ``dequantize_blocks``, which the tests check
these decoders against. Q4_K and Q6_K, most of a K-quant file, decode in C++ where it builds
(``csrc/gguf_decode.cpp``: the same values, bit for bit, in one pass); the numpy decoders are the reference.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import Q4_K

QK_K = 256  # values in a K-quant super-block
SOURCE = Path(__file__).parent / "csrc" / "gguf_decode.cpp"


class GroupCodes(NamedTuple):
    """A quantized matrix as ``w[r, k] = scales[r, k // group_size] * q[r, k] + offsets[r, k // group_size]``.

    A K-quant's scales are ``d * sc`` and its offsets ``-dmin * m`` per super-block of :data:`QK_K` columns:
    ``scale_supers`` holds each super-block's ``d`` and ``offset_supers`` its ``-dmin`` (float32 [rows, cols / 256]),
    so the group scales can be held as the small integers ``sc`` and ``m`` (quant_kernels.pack)."""

    q: np.ndarray  # int8 [rows, cols]
    scales: np.ndarray  # float32 [rows, cols // group_size]
    offsets: np.ndarray | None  # float32 like scales, or None where the type has no offset
    group_size: int
    scale_supers: np.ndarray | None = None
    offset_supers: np.ndarray | None = None


def supported(tensor_type: GGMLQuantizationType) -> bool:
    """Whether :func:`decode` keeps tensors of this type quantized."""
    return tensor_type in _DECODERS


@functools.cache
def load_decode_ops(source: Path = SOURCE) -> object | None:
    """``torch.ops.jido_gguf_decode`` built from ``source``, or None (with an error naming the numpy fallback)."""
    from jido.utils.cpp_build import load_ops_library

    if not load_ops_library("jido_gguf_decode", source, "C++ GGUF block decoders", "the numpy decoders"):
        return None
    return torch.ops.jido_gguf_decode


def decode(data: np.ndarray, tensor_type: GGMLQuantizationType, shape: tuple[int, ...],
           reference: bool = False) -> GroupCodes:
    """The codes of a 2-D tensor ``shape`` (``[rows, cols]``) stored as ``data`` (uint8, whole blocks per row);
    ``reference``: by the numpy decoders even where the C++ ones run.

    Raises:
        ValueError: the type is not one :func:`supported` accepts, or the bytes do not fill ``shape``.
    """
    if tensor_type not in _DECODERS:
        raise ValueError(f"GGML type {tensor_type.name} has no integer decoder; supported: "
                         f"{sorted(t.name for t in _DECODERS)}")
    rows, cols = shape
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    if cols % block_size or data.size != rows * cols // block_size * type_size:
        raise ValueError(f"{tensor_type.name} data of {data.size} bytes does not hold a [{rows}, {cols}] tensor")
    blocks = np.ascontiguousarray(data).reshape(-1, type_size)
    native = None if reference else _NATIVE.get(tensor_type)
    ops = load_decode_ops() if native is not None else None
    decoder = _DECODERS[tensor_type] if ops is None else functools.partial(native, ops)
    q, scales, offsets, group_size = decoder(blocks)
    groups = cols // group_size
    supers = _SUPERS.get(tensor_type)
    scale_supers, offset_supers = (None, None) if supers is None else supers(blocks)
    return GroupCodes(
        q.reshape(rows, cols).astype(np.int8, copy=False),
        scales.reshape(rows, groups).astype(np.float32, copy=False),
        None if offsets is None else offsets.reshape(rows, groups).astype(np.float32, copy=False),
        group_size,
        None if scale_supers is None else scale_supers.reshape(rows, cols // QK_K),
        None if offset_supers is None else offset_supers.reshape(rows, cols // QK_K),
    )


_Decoded = tuple[np.ndarray, np.ndarray, "np.ndarray | None", int]


# Types whose ``scale * q + offset``, computed as two float32 roundings, is the gguf package's dequantization bit
# for bit. Q4_0 is not: the package computes ``d * (q - 8)``, one rounding where the codes' form has two.
_EXACT_IN_FLOAT32 = frozenset({GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
                               GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K,
                               GGMLQuantizationType.Q6_K})


def dequantizes_exactly(tensor_type: GGMLQuantizationType) -> bool:
    """Whether :func:`dequantize` gives the gguf package's float32 values, bit for bit, for this type."""
    return tensor_type in _EXACT_IN_FLOAT32


def dequantize(data: np.ndarray, tensor_type: GGMLQuantizationType, shape: tuple[int, ...]) -> torch.Tensor:
    """The 2-D tensor ``shape`` in float32: :func:`decode`, then ``scale * q + offset`` in vectorized torch.

    Several times faster than the gguf package's numpy dequantization (benchmarks/results/engine_start-*.md) and,
    for the types :func:`dequantizes_exactly` accepts, the same values.
    """
    codes = decode(data, tensor_type, shape)
    rows, cols = shape
    groups = cols // codes.group_size
    values = torch.from_numpy(codes.q).view(rows, groups, codes.group_size).to(torch.float32)
    values *= torch.from_numpy(codes.scales).view(rows, groups, 1)
    if codes.offsets is not None:
        values += torch.from_numpy(codes.offsets).view(rows, groups, 1)
    return values.view(rows, cols)


def _f16(blocks: np.ndarray) -> np.ndarray:
    return blocks.view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles are values 0..15 of a 32-value block, high nibbles values 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Bit j of the little-endian 32-bit ``qh`` is the fifth bit of value j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q8_0(blocks: np.ndarray) -> _Decoded:
    return blocks[:, 2:].view(np.int8), _f16(blocks[:, :2]), None, 32


def _q4_0(blocks: np.ndarray) -> _Decoded:
    d = _f16(blocks[:, :2])
    return _nibbles(blocks[:, 2:]), d, -8 * d, 32  # d * (q - 8)


def _q4_1(blocks: np.ndarray) -> _Decoded:
    return _nibbles(blocks[:, 4:]), _f16(blocks[:, :2]), _f16(blocks[:, 2:4]), 32


def _q5_0(blocks: np.ndarray) -> _Decoded:
    q = (_nibbles(blocks[:, 6:]) | (_high_bits(blocks[:, 2:6]) << 4)).astype(np.int8) - np.int8(16)
    return q, _f16(blocks[:, :2]), None, 32


def _q5_1(blocks: np.ndarray) -> _Decoded:
    q = _nibbles(blocks[:, 8:]) | (_high_bits(blocks[:, 4:8]) << 4)
    return q, _f16(blocks[:, :2]), _f16(blocks[:, 2:4]), 32


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the eight sub-blocks' scales ``d * sc`` and offsets ``-dmin * m``."""
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """K-quants pack 64 values per 32 bytes: the low nibbles are the first 32, the high nibbles the next 32."""
    qs = qs.reshape(qs.shape[0], -1, 32)
    return np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(qs.shape[0], -1)


def _q4_k(blocks: np.ndarray) -> _Decoded:
    scales, offsets = _k_scales(blocks)
    return _k_nibbles(blocks[:, 16:]), scales, offsets, 32


def _q5_k(blocks: np.ndarray) -> _Decoded:
    scales, offsets = _k_scales(blocks)
    qh = blocks[:, 16:48]
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # [n, 8 sub-blocks, 32]
    return _k_nibbles(blocks[:, 48:]) | (high.reshape(blocks.shape[0], -1) << 4), scales, offsets, 32


def _q6_k(blocks: np.ndarray) -> _Decoded:
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    sc, d = blocks[:, 192:208].view(np.int8).astype(np.float32), _f16(blocks[:, 208:210])
    low = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    low = (low & 0x0F).reshape(n, 2, 4, 32)  # two halves of 128, four runs of 32
    high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = (low | (high << 4)).astype(np.int8).reshape(n, QK_K) - np.int8(32)
    return q, d * sc, None, 16


def _blocks_tensor(blocks: np.ndarray) -> torch.Tensor:
    """The blocks as a uint8 tensor sharing their memory, read-only (the file's mapping) or not."""
    with warnings.catch_warnings():  # torch warns that a read-only array could be written through it: never here
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(blocks)


def _native_q4_k(ops: object, blocks: np.ndarray) -> _Decoded:
    q, scales, offsets = ops.decode_q4_k(_blocks_tensor(blocks))
    return q.numpy(), scales.numpy(), offsets.numpy(), 32


def _native_q6_k(ops: object, blocks: np.ndarray) -> _Decoded:
    q, scales = ops.decode_q6_k(_blocks_tensor(blocks))
    return q.numpy(), scales.numpy(), None, 16


def _k_supers(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: each super-block's ``d`` and ``-dmin``."""
    return _f16(blocks[:, :2]).reshape(-1), -_f16(blocks[:, 2:4]).reshape(-1)


def _q6_k_supers(blocks: np.ndarray) -> tuple[np.ndarray, None]:
    return _f16(blocks[:, 208:210]).reshape(-1), None


_NATIVE = {GGMLQuantizationType.Q4_K: _native_q4_k, GGMLQuantizationType.Q6_K: _native_q6_k}
_SUPERS = {GGMLQuantizationType.Q4_K: _k_supers, GGMLQuantizationType.Q5_K: _k_supers,
           GGMLQuantizationType.Q6_K: _q6_k_supers}
_DECODERS: dict[GGMLQuantizationType, Callable[[np.ndarray], _Decoded]] = {
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q5_0: _q5_0,
    GGMLQuantizationType.Q5_1: _q5_1,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}
