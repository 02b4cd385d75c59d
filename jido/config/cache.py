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

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)
        parse_size(self.kv_cache_memory)
        if self.kv_cache_dtype not in get_args(KVCacheDType):
            raise ValueError(f"kv_cache_dtype must be one of {list(get_args(KVCacheDType))}, "
                             f"got {self.kv_cache_dtype!r}")

    @property
    def kv_cache_bytes(self) -> int:
        return parse_size(self.kv_cache_memory)
