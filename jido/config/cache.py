"""CacheConfig: the paged KV cache's block size, memory, element type and prefix caching."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from jido.config.size import check_positive_int, parse_size

# vLLM's names; the attention backends map them to element types (jido/attention/kv_quant.py).
KVCacheDType = Literal["auto", "int8", "fp8_e4m3", "fp8_e5m2"]


@dataclass(frozen=True)
class CacheConfig:
    """The KV cache: paged blocks in one pool, sized in bytes."""

    block_size: int = 16
    """Tokens per KV block."""
    kv_cache_memory: int | str = "2GiB"
    """Bytes for the KV block pool, or a size like 512MiB."""
    enable_prefix_caching: bool = True
    """Reuse the cached full blocks of prompts that share a prefix."""
    kv_cache_dtype: KVCacheDType = "auto"
    """KV cache element type: auto (the model's dtype), or int8 / fp8 with a float32 scale per token and KV head."""
    kv_blend_recompute_ratio: float = 0.15
    """CacheBlend: share of the reused chunk tokens whose KV is recomputed (those that deviate most on
    kv_blend_check_layer); a request's kv_blend may set its own. 0 reuses every chunk as cached, 1 recomputes all."""
    kv_blend_check_layer: int = 1
    """CacheBlend: the layer whose KV deviation picks the tokens to recompute; layers up to it are computed in full."""
    kv_blend_separator: str | None = None
    """CacheBlend: a string that splits text prompts into cached chunks and a final question, like a kv_blend
    field with those chunks (default: none, only the kv_blend field blends)."""
    max_pinned_prefixes: int = 64
    """Prefixes pinned at once (POST /v1/cache, LLM.pin_prefix); one more is refused until one is unpinned. Each
    pin is checked against every admitted request, so thousands would slow admission."""

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)
        check_positive_int("max_pinned_prefixes", self.max_pinned_prefixes)
        parse_size(self.kv_cache_memory)
        check_recompute_ratio(self.kv_blend_recompute_ratio)
        if not isinstance(self.kv_blend_check_layer, int) or self.kv_blend_check_layer < 0:
            raise ValueError(f"kv_blend_check_layer must be a layer index >= 0, got {self.kv_blend_check_layer!r}")
        if self.kv_blend_separator is not None and not self.kv_blend_separator.strip():
            raise ValueError("kv_blend_separator must be a non-blank string, or unset")
        if self.kv_cache_dtype not in get_args(KVCacheDType):
            raise ValueError(f"kv_cache_dtype must be one of {list(get_args(KVCacheDType))}, "
                             f"got {self.kv_cache_dtype!r}")

    @property
    def kv_cache_bytes(self) -> int:
        return parse_size(self.kv_cache_memory)


def check_recompute_ratio(ratio: object) -> float:
    """A CacheBlend recompute ratio as a float in [0, 1], or ValueError saying so."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ValueError(f"kv_blend recompute ratio must be a number in [0, 1], got {ratio!r}")
    return float(ratio)
