"""DraftKV: where a proposer's own attention layers keep their KV — in the target's block pool, freed with it."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from jido.attention.backend import AttentionMetadata, StepAttentionMetadata, build_common_metadata
from jido.core.kv_cache_spec import KVCacheConfig, KVCacheSpec
from jido.models.config import ModelArchConfig
from jido.runner.model_runner import layer_kv_specs
from jido.runner.spec_decode import ProposerContext


@dataclass(frozen=True)
class _DraftLayer:
    """Where one draft layer's KV lives: its cache tensor, and which pool group's block table addresses it.

    A draft whose KV page is ``pack`` times smaller than the target's keeps ``pack`` layers in one pool
    layer: its tensor is viewed as ``pack`` times as many blocks, and pool block ``b`` of the group holds
    the layer's block ``b * pack + slot``.
    """

    cache: torch.Tensor
    group: int
    pack: int = 1
    slot: int = 0


class DraftKV:
    """The KV of a draft's ``num_layers`` attention layers (shaped by ``arch``), as pool layers after the target's.

    The scheduler allocates, caches and frees their blocks with the target's, so a draft position's slot is
    the target's slot of the same position. ``shares_target_kv``: the draft *is* the target's first layers
    (a layer-truncated self-draft) and reads and writes the target's own caches.
    """

    def __init__(self, context: ProposerContext, arch: ModelArchConfig, num_layers: int,
                 shares_target_kv: bool = False) -> None:
        self.context, self.arch, self.num_layers = context, arch, num_layers
        self.shares_target_kv = shares_target_kv
        self.layers: list[_DraftLayer] = []
        self._first_layer_id = 0

    @property
    def caches(self) -> list[torch.Tensor]:
        return [layer.cache for layer in self.layers]

    def kv_cache_spec(self, first_layer_id: int) -> dict[int, KVCacheSpec]:
        """The draft's layers as pool layers from ``first_layer_id`` on (several packed in one if pages are smaller)."""
        if self.shares_target_kv:
            return {}
        self._first_layer_id = first_layer_id
        specs, _ = self._packing()
        return {first_layer_id + i: spec for i, spec in enumerate(specs)}

    def bind_kv_cache(self, kv_cache_config: KVCacheConfig, tensors: list[torch.Tensor],
                      target_caches: list[torch.Tensor], target_groups: list[int]) -> None:
        if self.shares_target_kv:
            self.layers = [_DraftLayer(target_caches[i], target_groups[i]) for i in range(self.num_layers)]
            return
        pack, ctx = self._pack(), self.context
        shape = ctx.attn_backend.get_kv_cache_shape(kv_cache_config.num_blocks * pack, ctx.block_size,
                                                    self.arch.num_kv_heads, self.arch.head_dim, ctx.kv_cache_dtype)
        self.layers = []
        for pool_index, slot in self._packing()[1]:
            pool_layer = self._first_layer_id + pool_index
            # NOTE: the view reinterprets each pool block as `pack` consecutive draft blocks; every backend's
            # layout puts the block index right after the K/V index, with each block contiguous.
            cache = tensors[kv_cache_config.tensor_index(pool_layer)].view(shape)
            self.layers.append(_DraftLayer(cache, kv_cache_config.group_index(pool_layer), pack, slot))

    def _packing(self) -> tuple[list[KVCacheSpec], list[tuple[int, int]]]:
        """The pool layers' specs, and each draft layer's (pool layer, slot in it).

        ``pack`` draft layers of one spec (the same window) share a pool layer, as KV heads side by side:
        the same page bytes as a target layer.
        """
        pack = self._pack()
        by_spec: dict[KVCacheSpec, list[int]] = {}
        for layer_id, spec in enumerate(self._draft_specs()):
            by_spec.setdefault(spec, []).append(layer_id)
        specs: list[KVCacheSpec] = []
        places: dict[int, tuple[int, int]] = {}
        for spec, layer_ids in by_spec.items():
            for start in range(0, len(layer_ids), pack):
                for slot, layer_id in enumerate(layer_ids[start:start + pack]):
                    places[layer_id] = (len(specs), slot)
                specs.append(replace(spec, num_kv_heads=spec.num_kv_heads * pack))
        return specs, [places[i] for i in range(self.num_layers)]

    def _draft_specs(self) -> list[KVCacheSpec]:
        specs = layer_kv_specs(self.arch, self.context.block_size, self.context.kv_cache_dtype)
        return [specs[i] for i in range(self.num_layers)]

    def _pack(self) -> int:
        """How many draft layers share one pool layer: the target's page over the draft's."""
        target_page = layer_kv_specs(self.context.model_arch, self.context.block_size,
                                     self.context.kv_cache_dtype)[0].page_size_bytes
        draft_page = self._draft_specs()[0].page_size_bytes
        if target_page % draft_page:
            raise ValueError(f"the draft model's KV page ({draft_page} bytes per block and layer) does not divide "
                             f"the target's ({target_page}): their KV cannot share one block pool")
        return target_page // draft_page

    def attention_metadata(self, query_lens: list[int], seq_lens: list[int], rows: np.ndarray,
                           batch_tables: list[np.ndarray]) -> StepAttentionMetadata:
        """Each draft layer's backend metadata for a flat batch of the input batch's ``rows`` (``batch_tables``:
        the input batch's block tables, one per pool group)."""
        block_size = self.context.block_size
        max_blocks = -(-max(seq_lens) // block_size)
        built: dict[tuple[int, int], object] = {}
        for layer in self.layers:
            key = (layer.group, layer.slot)
            if key not in built:
                table = batch_tables[layer.group][rows, :max_blocks].astype(np.int64) * layer.pack + layer.slot
                common: AttentionMetadata = build_common_metadata(query_lens, seq_lens, table, block_size,
                                                                  self.context.device)
                built[key] = self.context.attn_backend.build_metadata(common)
        return StepAttentionMetadata([built[(layer.group, layer.slot)] for layer in self.layers], max(seq_lens))
