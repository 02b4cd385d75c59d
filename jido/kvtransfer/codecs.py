"""KV codecs for blocks at rest (offload tiers) and on the wire: raw bytes, int8 per channel, and CacheGen-style.

Every codec takes one group's block in the connectors' layout, ``[num_layers, 2, block_size, num_kv_heads,
width]`` (K then V; ``width`` is ``head_dim``, or ``head_dim + 4`` for a quantized cache's rows), and gives
bytes; ``decode`` gives the same shape back in the cache's dtype. ``raw`` is exact; ``int8`` and
``cachegen`` quantize each channel (layer, K or V, KV head, dimension) over the block's tokens with a
float16 scale, so they need a float cache (an int8 / fp8 cache's rows are already quantized: use ``raw``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
import zstandard

from jido.attention.kv_quant import is_quantized


class KVCodec(ABC):
    """Turns one block of KV into bytes and back; ``name`` is recorded in every stored entry."""

    name: str

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers

    @abstractmethod
    def encode(self, block: torch.Tensor, layer_ids: tuple[int, ...]) -> bytes: ...

    @abstractmethod
    def decode(self, payload: memoryview, shape: tuple[int, ...], dtype: torch.dtype,
               layer_ids: tuple[int, ...]) -> torch.Tensor: ...


class RawCodec(KVCodec):
    """The cache's own bytes, exactly."""

    name = "raw"

    def encode(self, block: torch.Tensor, layer_ids: tuple[int, ...]) -> bytes:
        return block.contiguous().view(torch.uint8).numpy().tobytes()

    def decode(self, payload: memoryview, shape: tuple[int, ...], dtype: torch.dtype,
               layer_ids: tuple[int, ...]) -> torch.Tensor:
        return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(shape)


def _channel_scales(x: torch.Tensor, qmax: torch.Tensor) -> torch.Tensor:
    """float16 scales ``[L, 2, 1, H, D]``: each channel's largest magnitude over the tokens, over ``qmax``."""
    scale = (x.abs().amax(dim=2, keepdim=True) / qmax).to(torch.float16)
    return scale.clamp_(max=torch.finfo(torch.float16).max)


def _quantize(x: torch.Tensor, scale: torch.Tensor, qmax: torch.Tensor) -> np.ndarray:
    """int8 codes of ``x`` under ``scale`` (a zero scale gives zeros), rounded to nearest even."""
    # numpy, not torch: on a busy machine torch's rounding of a block waits on its thread pool, numpy's does not.
    s = scale.float().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, x.numpy() / s, 0.0)
    bound = qmax.numpy()
    return np.clip(np.rint(q), -bound, bound).astype(np.int8)


class Int8Codec(KVCodec):
    """int8 values with a float16 scale per channel: about half of bf16's bytes, a quarter of float32's."""

    name = "int8"

    def encode(self, block: torch.Tensor, layer_ids: tuple[int, ...]) -> bytes:
        x = block.float()
        qmax = torch.tensor(127.0)
        scale = _channel_scales(x, qmax)
        return scale.numpy().tobytes() + _quantize(x, scale, qmax).tobytes()

    def decode(self, payload: memoryview, shape: tuple[int, ...], dtype: torch.dtype,
               layer_ids: tuple[int, ...]) -> torch.Tensor:
        num_layers, _, block_size, heads, dim = shape
        num_scales = num_layers * 2 * heads * dim
        scale = np.frombuffer(payload, np.float16, num_scales).reshape(num_layers, 2, 1, heads, dim)
        q = np.frombuffer(payload, np.int8, offset=2 * num_scales).reshape(shape)
        return (torch.from_numpy(q.astype(np.float32)) * torch.from_numpy(scale.astype(np.float32))).to(dtype)


def cachegen_bits(layer_id: int, num_layers: int) -> int:
    """Bits per value for a layer: 8 in the first third of the model, 6 in the middle, 5 in the last third.

    CacheGen (Liu et al., SIGCOMM 2024) finds early layers' KV errors hurt most, as later layers build on them.
    """
    third = layer_id * 3 // max(num_layers, 1)
    return (8, 6, 5)[min(third, 2)]


class CacheGenCodec(KVCodec):
    """CacheGen-style: per-layer bits, per-channel scales, deltas along the tokens, zstd over the deltas.

    Each channel is quantized to its layer's bits; neighbouring tokens' codes are close, so each code is
    stored as its difference from the previous token's (mod 256, undone exactly by a cumulative sum), laid
    out channel by channel so zstd sees long runs of small numbers.
    """

    name = "cachegen"

    def __init__(self, num_layers: int, level: int = 3) -> None:
        super().__init__(num_layers)
        self._compressor = zstandard.ZstdCompressor(level=level)
        self._decompressor = zstandard.ZstdDecompressor()

    def _qmax(self, layer_ids: tuple[int, ...]) -> torch.Tensor:
        bits = torch.tensor([cachegen_bits(i, self.num_layers) for i in layer_ids], dtype=torch.float32)
        return (2 ** (bits - 1) - 1).view(-1, 1, 1, 1, 1)

    def encode(self, block: torch.Tensor, layer_ids: tuple[int, ...]) -> bytes:
        x = block.float()
        qmax = self._qmax(layer_ids)
        scale = _channel_scales(x, qmax)
        codes = _quantize(x, scale, qmax).view(np.uint8)
        # [L, 2, T, H, D] -> [L, 2, H, D, T]: one channel's tokens side by side
        codes = np.ascontiguousarray(np.moveaxis(codes, 2, -1))
        deltas = np.diff(codes, axis=-1, prepend=np.uint8(0))  # uint8 arithmetic wraps: exact mod 256
        return scale.numpy().tobytes() + self._compressor.compress(deltas.tobytes())

    def decode(self, payload: memoryview, shape: tuple[int, ...], dtype: torch.dtype,
               layer_ids: tuple[int, ...]) -> torch.Tensor:
        num_layers, _, block_size, heads, dim = shape
        num_scales = num_layers * 2 * heads * dim
        scale = np.frombuffer(payload, np.float16, num_scales).reshape(num_layers, 2, 1, heads, dim)
        raw = self._decompressor.decompress(bytes(payload[2 * num_scales:]))
        deltas = np.frombuffer(raw, np.uint8).reshape(num_layers, 2, heads, dim, block_size)
        codes = np.cumsum(deltas, axis=-1, dtype=np.uint8).view(np.int8)
        codes = np.moveaxis(codes, -1, 2)
        return (torch.from_numpy(codes.astype(np.float32)) * torch.from_numpy(scale.astype(np.float32))).to(dtype)


CODECS: dict[str, type[KVCodec]] = {"raw": RawCodec, "int8": Int8Codec, "cachegen": CacheGenCodec}


def make_codec(name: str, num_layers: int, cache_dtype: torch.dtype) -> KVCodec:
    """The codec ``name`` for a model of ``num_layers`` layers whose cache holds ``cache_dtype``.

    Raises:
        ValueError: an unknown codec, or a quantizing codec over an already quantized cache.
    """
    if name not in CODECS:
        raise ValueError(f"unknown KV codec {name!r}; available: {sorted(CODECS)}")
    if name != "raw" and is_quantized(cache_dtype):
        raise ValueError(f"KV codec {name!r} quantizes a float cache, but this cache already holds quantized "
                         f"{str(cache_dtype).removeprefix('torch.')} rows: use codec 'raw' for them")
    return CODECS[name](num_layers)
