"""LayerwiseHooks: an attention backend wrapper that calls the worker connector's per-layer hooks in the forward."""
from __future__ import annotations

from typing import Any

import torch

from jido.attention.backend import AttentionBackend, AttentionLayerSpec, AttentionMetadata
from jido.kvtransfer.base import KVConnectorWorker


class LayerwiseHooks(AttentionBackend):
    """The model's backend with :meth:`KVConnectorWorker.wait_for_layer_load` before and
    :meth:`KVConnectorWorker.save_kv_layer` after each layer's attention, so transfers overlap the forward.

    NOTE: layers are numbered by the order of ``forward`` calls within a step (every model calls attention
    once per layer, first to last); the runner calls :meth:`begin_step` before each forward, with the first
    layer it runs (a CacheBlend prefill runs its layers in two parts, after the batch's forward). Until the runner
    binds its connector (once the KV cache exists) the hooks call nothing: w8a8's calibration forward runs before.
    """

    def __init__(self, inner: AttentionBackend, connector: KVConnectorWorker | None) -> None:
        self.inner = inner
        self.connector = connector
        self.name = inner.name
        self._layer = 0

    def begin_step(self, first_layer: int = 0) -> None:
        self._layer = first_layer

    def get_kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                           dtype: torch.dtype | None = None) -> tuple[int, ...]:
        return self.inner.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim, dtype)

    def build_metadata(self, common: AttentionMetadata) -> Any:
        return self.inner.build_metadata(common)

    def forward(self, spec: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, metadata: Any) -> torch.Tensor:
        if self.connector is None:
            return self.inner.forward(spec, q, k, v, kv_cache, metadata)
        layer, self._layer = self._layer, self._layer + 1
        self.connector.wait_for_layer_load(layer)
        out = self.inner.forward(spec, q, k, v, kv_cache, metadata)
        self.connector.save_kv_layer(layer, kv_cache, metadata)
        return out
