"""CacheConfig: the paged KV cache's block size, memory and prefix caching."""
from __future__ import annotations

from dataclasses import dataclass

from jido.config.size import check_positive_int, parse_size


@dataclass(frozen=True)
class CacheConfig:
    """The KV cache: paged blocks in one pool, sized in bytes."""

    block_size: int = 16
    """Tokens per KV block."""
    kv_cache_memory: int | str = "2GiB"
    """Bytes for the KV block pool, or a size like 512MiB."""
    enable_prefix_caching: bool = True
    """Reuse the cached full blocks of prompts that share a prefix."""

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)
        parse_size(self.kv_cache_memory)

    @property
    def kv_cache_bytes(self) -> int:
        return parse_size(self.kv_cache_memory)
