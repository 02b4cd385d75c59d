"""KV cache specs: what each layer keeps per token, and how layers are grouped over one block pool."""
from __future__ import annotations

from dataclasses import dataclass

from jido.utils.hf_config import kv_tokens_held


@dataclass(frozen=True)
class FullAttentionSpec:
    """A layer that attends to the whole context: it keeps K/V for every token.

    ``page_size_bytes`` is one block of one layer (keys and values, and a quantized cache's scales: one of
    ``scale_bytes`` per token, KV head and K or V); the attention backend decides the layout inside it, the
    core only counts bytes.
    """

    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    scale_bytes: int = 0

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * (self.head_dim * self.dtype_bytes + self.scale_bytes)

    def num_live_blocks(self, num_tokens: int) -> int:
        """Blocks a request of ``num_tokens`` tokens holds while it decodes (the planner's formula too)."""
        return kv_tokens_held(num_tokens, None, self.block_size) // self.block_size

    def num_peak_blocks(self, num_tokens: int, chunk: int) -> int:
        """Blocks a request of ``num_tokens`` tokens holds at most, prefilled in chunks of ``chunk`` tokens."""
        return -(-num_tokens // self.block_size)


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """A layer whose query at ``p`` sees keys ``p - sliding_window < k <= p``: blocks behind the window die."""

    sliding_window: int = 0

    def __post_init__(self) -> None:
        if self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")

    def num_dead_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks no query from ``num_computed_tokens`` on can see again.

        The next query sits at ``num_computed_tokens`` and sees keys from ``num_computed_tokens -
        sliding_window + 1``; every block that ends before that is dead.
        """
        return max(0, num_computed_tokens - self.sliding_window + 1) // self.block_size

    def num_peak_blocks(self, num_tokens: int, chunk: int) -> int:
        # A chunk's queries see the window before the chunk plus the chunk itself.
        chunk = min(chunk, num_tokens)
        reach = -(-(self.sliding_window - 1 + chunk) // self.block_size) + 1
        return min(-(-num_tokens // self.block_size), reach)

    def num_live_blocks(self, num_tokens: int) -> int:
        return kv_tokens_held(num_tokens, self.sliding_window, self.block_size) // self.block_size


KVCacheSpec = FullAttentionSpec  # SlidingWindowSpec is a FullAttentionSpec with a window


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table per request, because they keep the same tokens."""

    layer_ids: tuple[int, ...]
    spec: KVCacheSpec


@dataclass(frozen=True)
class KVCacheConfig:
    """How the block pool is laid over the layers (vLLM's hybrid allocator).

    Every group has at most ``group_size`` layers. There are ``group_size`` physical tensors of
    ``num_blocks`` blocks; layer ``j`` of every group lives in tensor ``j``. A block belongs to one group
    at a time, so groups share one pool and one block id means the same slots in each tensor.
    NOTE: this needs every layer's page to be the same size (same head counts, head size and dtype).
    """

    num_blocks: int
    groups: tuple[KVCacheGroup, ...]
    group_size: int
    page_size_bytes: int  # one block of one layer

    @property
    def block_size(self) -> int:
        return self.groups[0].spec.block_size

    @property
    def block_bytes(self) -> int:
        """Bytes one pool block stands for: one page in each of the ``group_size`` tensors."""
        return self.group_size * self.page_size_bytes

    def tensor_index(self, layer_id: int) -> int:
        """Which physical tensor holds ``layer_id``'s cache."""
        for group in self.groups:
            if layer_id in group.layer_ids:
                return group.layer_ids.index(layer_id)
        raise KeyError(f"layer {layer_id} is in no KV cache group")

    def group_index(self, layer_id: int) -> int:
        for i, group in enumerate(self.groups):
            if layer_id in group.layer_ids:
                return i
        raise KeyError(f"layer {layer_id} is in no KV cache group")


def group_layers(layer_specs: dict[int, KVCacheSpec]) -> tuple[tuple[KVCacheGroup, ...], int]:
    """Split layers into groups of equal size, one spec per group; returns the groups and the size.

    With one kind of layer there is one group of every layer (one block table per request, as without
    hybrid caching). With several, the group size is the smallest kind's layer count, so that kind fills
    exactly one group and the others fill several (the last may be short: its missing slots stay unused).
    """
    by_spec: dict[KVCacheSpec, list[int]] = {}
    for layer_id in sorted(layer_specs):
        by_spec.setdefault(layer_specs[layer_id], []).append(layer_id)
    page_sizes = {spec.page_size_bytes for spec in by_spec}
    if len(page_sizes) != 1:
        raise ValueError(f"every layer's KV page must have the same size, got {sorted(page_sizes)} bytes")
    group_size = min(len(ids) for ids in by_spec.values())
    # Full-attention groups first: their block tables are the prefix every hit must extend.
    ordered = sorted(by_spec.items(), key=lambda item: isinstance(item[0], SlidingWindowSpec))
    groups = [KVCacheGroup(tuple(ids[i:i + group_size]), spec)
              for spec, ids in ordered for i in range(0, len(ids), group_size)]
    return tuple(groups), group_size


def make_kv_cache_config(layer_specs: dict[int, KVCacheSpec], available_bytes: int) -> KVCacheConfig:
    """Group the layers and size the pool to ``available_bytes``.

    Raises:
        ValueError: no block fits, or the layers' pages differ in size.
    """
    if not layer_specs:
        raise ValueError("the model reported no attention layers")
    groups, group_size = group_layers(layer_specs)
    page = groups[0].spec.page_size_bytes
    num_blocks = available_bytes // (group_size * page)
    if num_blocks < 1:
        raise ValueError(f"{available_bytes} bytes hold no KV block: one block takes {group_size * page} bytes")
    return KVCacheConfig(num_blocks, groups, group_size, page)


def blocks_per_request(config: KVCacheConfig, num_tokens: int) -> int:
    """Pool blocks one decoding request of ``num_tokens`` tokens holds, over all groups."""
    return sum(group.spec.num_live_blocks(num_tokens) for group in config.groups)


def peak_blocks_per_request(config: KVCacheConfig, num_tokens: int, chunk: int) -> int:
    """Pool blocks one request of ``num_tokens`` tokens holds at most, prefilled in chunks of ``chunk`` tokens."""
    return sum(group.spec.num_peak_blocks(num_tokens, chunk) for group in config.groups)
