"""BlockIO: a worker's cache tensors read and written block by block in the connectors' layout, and KV precision
converted between two caches' dtypes."""
from __future__ import annotations

import torch

from jido.attention.kv_quant import cache_rows, is_quantized, read_rows
from jido.core.kv_cache_spec import KVCacheConfig


class BlockIO:
    """Block ``b`` of a group as one tensor ``[layers, 2, block_size, num_kv_heads, width]`` (K then V, tokens on
    axis 2), whatever the attention backend's layout; ``layer_ids`` picks some of the group's layers."""

    def __init__(self, kv_caches: list[torch.Tensor], kv_cache_config: KVCacheConfig, block_token_dim: int) -> None:
        self.kv_caches = kv_caches
        self.kv_cache_config = kv_cache_config
        self.block_token_dim = block_token_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.kv_caches[0].dtype

    def layers(self, group: int) -> tuple[int, ...]:
        return self.kv_cache_config.groups[group].layer_ids

    def read(self, group: int, block_id: int, layer_ids: tuple[int, ...] | None = None) -> torch.Tensor:
        """A copy on the CPU of the block's rows in ``layer_ids`` (default: the group's layers)."""
        layers = self.layers(group) if layer_ids is None else layer_ids
        # [layers, 2, ...block in the backend's layout] -> tokens on axis 2
        block = torch.stack([self.kv_caches[layer][:, block_id] for layer in layers])
        return block.movedim(self.block_token_dim + 1, 2).to("cpu", copy=True)

    def write(self, group: int, block_id: int, data: torch.Tensor, layer_ids: tuple[int, ...] | None = None) -> None:
        """Write ``data`` (the shape :meth:`read` gives, this cache's dtype) into the block."""
        layers = self.layers(group) if layer_ids is None else layer_ids
        for layer, rows in zip(layers, data):
            cache = self.kv_caches[layer]
            cache[:, block_id].copy_(rows.movedim(1, self.block_token_dim).to(cache.device))

    def shape(self, group: int, layer_ids: tuple[int, ...] | None = None) -> tuple[int, ...]:
        num_layers = len(self.layers(group) if layer_ids is None else layer_ids)
        one = self.kv_caches[0][:, 0].movedim(self.block_token_dim, 1).shape  # [2, block_size, kv_heads, width]
        return (num_layers, *one)


def convert_rows(data: torch.Tensor, dtype: torch.dtype, head_dim: int) -> torch.Tensor:
    """Rows of one cache's dtype (``[..., width]``) as rows of a cache of ``dtype``: cast, quantized with their
    scales, or dequantized, as the two dtypes need (float32 -> bf16, bf16 -> int8, int8 -> float32, ...)."""
    if data.dtype == dtype:
        return data
    if not is_quantized(data.dtype) and not is_quantized(dtype):
        return data.to(dtype)
    return cache_rows(read_rows(data, head_dim), dtype)
